"""The built-in GPU policy library (YAML files); read only through :mod:`policies.sources`."""
