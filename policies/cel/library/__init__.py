"""The Kubernetes CEL libraries, one module per library of ``k8s.io/apiserver/pkg/cel/library``.

What the CEL environment adds on top of the CEL standard library and the runtime's own
extensions: :mod:`~policies.cel.library.quantity`, :mod:`~policies.cel.library.lists`,
:mod:`~policies.cel.library.sets`, :mod:`~policies.cel.library.regex`,
:mod:`~policies.cel.library.semver`, :mod:`~policies.cel.library.ip`,
:mod:`~policies.cel.library.cidr`, :mod:`~policies.cel.library.urls` and
:mod:`~policies.cel.library.jsonpatch`; :mod:`~policies.cel.library.opaque` holds the functions
several opaque types share, :mod:`~policies.cel.library.comparison` CEL equality and ordering on
plain values, :mod:`~policies.cel.library.declarations` the declaration form and
:mod:`~policies.cel.library.libraries` the table of every function (``LIBRARY``), which
``policies/cel/runtime.py`` turns into runtime declarations.

Values that Kubernetes represents as opaque CEL types (Quantity, Semver, IP, CIDR, URL) travel as
one-key maps, e.g. ``{"__ip__": "10.0.0.1"}``, because the runtime cannot hold Python objects.
Implementations receive plain Python values (the runtime converts arguments) and signal CEL errors
by raising: ``TypeError`` for "no such overload" (arrives as ``INVALID_ARGUMENT``), ``ValueError``
for bad values (``OUT_OF_RANGE``).

No module of this package may import the CEL runtime (only ``policies/cel/runtime.py`` may) or do
I/O. Import the modules themselves: this package re-exports nothing.
"""
