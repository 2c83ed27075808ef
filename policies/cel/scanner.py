"""The one reader of CEL source text: tokens, comments, string literals, references and scopes.

Owns every question gpuguard asks of an expression *as text* before or besides compiling it:
which ``variables.<name>``, ``params.<key>`` and ``gpu.<field>`` it references, whether it uses
``variables`` or ``params`` some other way (indexed by an expression, passed whole), which names
its comprehensions and ``cel.bind`` calls bind and where, and the code with comments dropped and
string literals emptied. The lexical rules are the CEL language definition's (cel-spec
``doc/langdef.md``, "Syntax"): identifiers ``[_a-zA-Z][_a-zA-Z0-9]*``; string and bytes literals
with ``r``/``b`` prefixes in either order, single, double and triple quotes, raw strings without
escapes; line comments ``//``; backquoted field names (``a.`b-c```); the optional-select ``.?``
and optional-index ``[?`` of the optional-types extension.

A name bound by a macro (``all``, ``exists``, ``exists_one``, ``map``, ``filter``, the
two-variable forms, ``transformList``/``transformMap``/``transformMapEntry``) is in scope inside
that call's parentheses after the binding arguments; one bound by ``cel.bind(name, init, body)``
only inside ``body``. A reference to a bound name is local, not the activation's variable: so
``[1].all(gpu, gpu > 0) && gpu.cuont > 0`` still reports ``gpu.cuont``.

Must not compile or evaluate anything (that is :mod:`policies.cel.runtime`), and must never raise
on any input: text that is not valid CEL is tokenised as far as it goes (an unterminated string
runs to the end), and the compiler reports the error.
"""

from __future__ import annotations

import enum
import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache


class TokenKind(enum.StrEnum):
    """What a token is; spaces are not tokens."""

    IDENT = "ident"
    QUOTED_FIELD = "quoted-field"  # `a-b` after '.'
    STRING = "string"  # string or bytes literal, quotes and prefix included
    NUMBER = "number"
    PUNCT = "punct"
    COMMENT = "comment"


@dataclass(frozen=True, slots=True)
class Token:
    """One token: its kind, its text as written, and its [start, end) character offsets."""

    kind: TokenKind
    text: str
    start: int
    end: int


_STRING = re.compile(
    r"""(?:[rR][bB]?|[bB][rR]?)?(?:'''|\"\"\"|'|")""",
)
_IDENT = re.compile(r"[_a-zA-Z][_a-zA-Z0-9]*")
_NUMBER = re.compile(
    r"0[xX][0-9a-fA-F]+[uU]?|(?:[0-9]+\.[0-9]+|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?[uU]?"
)
_PUNCT = re.compile(r"==|!=|<=|>=|&&|\|\||\.\?|\[\?|[-+*/%!<>?:.,()\[\]{}]")
_SPACE = re.compile(r"[ \t\n\r\f\v]+")

#: The CEL spec's reserved words ("Syntax"): never an identifier.
RESERVED = frozenset({
    "true", "false", "null", "in", "as", "break", "const", "continue", "else", "for",
    "function", "if", "import", "let", "loop", "package", "namespace", "return", "var", "void",
    "while"})


def is_identifier(name: str) -> bool:
    """Whether ``name`` is a CEL identifier: ``[_a-zA-Z][_a-zA-Z0-9]*`` and not a
    :data:`RESERVED` word (what Kubernetes' ``isCELIdentifier`` requires of a variable name)."""
    return _IDENT.fullmatch(name) is not None and name not in RESERVED


#: Macros and comprehension functions that bind one or two names (cel-spec macros, cel-go's
#: two-variable comprehensions extension).
BINDING_MACROS = frozenset({
    "all", "exists", "exists_one", "existsOne", "map", "filter",
    "transformList", "transformMap", "transformMapEntry", "sortBy",
})


def _string_end(source: str, start: int, body: int, quote: str, raw: bool) -> int:
    """Offset just past the literal whose text (after prefix) starts at ``body`` with ``quote``;
    the end of the source when it is unterminated."""
    i, n = body, len(source)
    single = len(quote) == 1
    while i < n:
        char = source[i]
        if not raw and char == "\\":
            i += 2
            continue
        if single and char == "\n":
            return i  # a one-line literal cannot span lines: stop, the compiler says why
        if source.startswith(quote, i):
            return i + len(quote)
        i += 1
    return n


@lru_cache(maxsize=4096)
def tokenize(source: str) -> tuple[Token, ...]:
    """The tokens of ``source`` in order (comments included as ``COMMENT`` tokens).

    Never raises: a character CEL does not know becomes a one-character ``PUNCT`` token.
    """
    tokens: list[Token] = []
    i, n = 0, len(source)
    while i < n:
        if (space := _SPACE.match(source, i)) is not None:
            i = space.end()
            continue
        if source.startswith("//", i):
            end = source.find("\n", i)
            end = n if end < 0 else end
            tokens.append(Token(TokenKind.COMMENT, source[i:end], i, end))
            i = end
            continue
        if (opening := _STRING.match(source, i)) is not None:
            prefix = opening.group().rstrip("'\"")
            quote = opening.group()[len(prefix):]
            end = _string_end(source, i, opening.end(), quote, "r" in prefix.lower())
            tokens.append(Token(TokenKind.STRING, source[i:end], i, end))
            i = end
            continue
        if source[i] == "`":
            end = source.find("`", i + 1)
            end = n if end < 0 else end + 1
            tokens.append(Token(TokenKind.QUOTED_FIELD, source[i:end], i, end))
            i = end
            continue
        if (ident := _IDENT.match(source, i)) is not None:
            tokens.append(Token(TokenKind.IDENT, ident.group(), i, ident.end()))
            i = ident.end()
            continue
        if (number := _NUMBER.match(source, i)) is not None and not (
                source[i] == "." and tokens and tokens[-1].kind is not TokenKind.PUNCT):
            tokens.append(Token(TokenKind.NUMBER, number.group(), i, number.end()))
            i = number.end()
            continue
        punct = _PUNCT.match(source, i)
        end = punct.end() if punct is not None else i + 1
        tokens.append(Token(TokenKind.PUNCT, source[i:end], i, end))
        i = end
    return tuple(tokens)


def _rewritten(source: str, *, empty_strings: bool) -> str:
    """``source`` with comments dropped and, with ``empty_strings``, string literals as ``""``."""
    parts: list[str] = []
    position = 0
    for token in tokenize(source):
        if token.kind is TokenKind.COMMENT or (empty_strings and token.kind is TokenKind.STRING):
            parts.append(source[position:token.start])
            if token.kind is TokenKind.STRING:
                parts.append('""')
            position = token.end
    parts.append(source[position:])
    return "".join(parts)


def code_only(source: str) -> str:
    """``source`` with comments dropped and every string literal replaced by ``""``: what is
    left is code, so a search in it cannot match inside text."""
    return _rewritten(source, empty_strings=True)


def without_comments(source: str) -> str:
    """``source`` with its comments dropped (a trailing one would swallow appended text)."""
    return _rewritten(source, empty_strings=False)


@dataclass(frozen=True, slots=True)
class Reference:
    """One use of a top-level name (``variables``, ``params``, ``gpu``, …) in an expression.

    ``field`` is the selected member (``variables.x`` and ``variables['x']`` give ``"x"``;
    ``variables.?x`` too), ``None`` when the name is used some other way (indexed by an
    expression, passed whole). ``in_has`` is true for ``has(name.field)``, ``optional`` for
    ``name.?field`` and ``name[?'field']`` (an optional value, not the member), ``indexed`` for
    ``name['field']`` and ``name[?'field']``. ``start``/``end``
    span the name and its selection in the source.
    """

    name: str
    field: str | None
    start: int
    end: int
    in_has: bool = False
    optional: bool = False
    indexed: bool = False


def _code(source: str) -> list[Token]:
    return [t for t in tokenize(source) if t.kind is not TokenKind.COMMENT]


def _closing(tokens: Sequence[Token], opening: int) -> int:
    """Index of the bracket closing ``tokens[opening]`` (or ``len(tokens)`` when unbalanced)."""
    depth = 0
    for index in range(opening, len(tokens)):
        text = tokens[index].text
        if text in ("(", "[", "{", "[?"):
            depth += 1
        elif text in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return index
    return len(tokens)


def _top_level(tokens: Sequence[Token], opening: int, closing: int) -> Iterator[int]:
    """Indexes of the tokens directly inside the brackets ``opening``..``closing`` (not nested
    deeper); brackets themselves are not yielded."""
    depth = 0
    for index in range(opening + 1, closing):
        text = tokens[index].text
        if text in ("(", "[", "{", "[?"):
            depth += 1
        elif text in (")", "]", "}"):
            depth -= 1
        elif depth == 0:
            yield index


def _top_level_commas(tokens: Sequence[Token], opening: int, closing: int) -> list[int]:
    return [i for i in _top_level(tokens, opening, closing) if tokens[i].text == ","]


@dataclass(frozen=True, slots=True)
class Binding:
    """A name bound by a macro or ``cel.bind``, in scope for token indexes [start, end)."""

    name: str
    start: int
    end: int


def _bindings(tokens: Sequence[Token]) -> list[Binding]:
    found: list[Binding] = []
    for index, token in enumerate(tokens):
        if token.kind is not TokenKind.IDENT or index + 1 >= len(tokens) \
                or tokens[index + 1].text != "(" or index == 0 or tokens[index - 1].text != ".":
            continue
        opening = index + 1
        closing = _closing(tokens, opening)
        commas = _top_level_commas(tokens, opening, closing)
        is_bind = token.text == "bind" and index >= 2 and tokens[index - 2].text == "cel"
        if is_bind:
            if len(commas) >= 2 and commas[0] == opening + 2 \
                    and tokens[opening + 1].kind is TokenKind.IDENT:
                found.append(Binding(tokens[opening + 1].text, commas[1] + 1, closing))
            continue
        if token.text not in BINDING_MACROS:
            continue
        # Leading arguments that are a bare identifier followed by a comma are bound names.
        argument_start = opening + 1
        names: list[str] = []
        for comma in commas[:2]:
            if comma == argument_start + 1 and tokens[argument_start].kind is TokenKind.IDENT:
                names.append(tokens[argument_start].text)
                argument_start = comma + 1
            else:
                break
        for name in names:
            found.append(Binding(name, argument_start, closing))
    return found


def bound_names(source: str) -> frozenset[str]:
    """Every name a macro or ``cel.bind`` in ``source`` binds."""
    return frozenset(b.name for b in _bindings(_code(source)))


def references(source: str, name: str) -> tuple[Reference, ...]:
    """Every use of the top-level ``name`` in ``source`` outside strings, comments and the scopes
    where a macro or ``cel.bind`` binds ``name`` itself; a ``name`` right after ``.`` is a member
    of something else (``t.gpu``) and not a use."""
    tokens = _code(source)
    scopes = [b for b in _bindings(tokens) if b.name == name]
    found: list[Reference] = []
    for index, token in enumerate(tokens):
        if token.kind is not TokenKind.IDENT or token.text != name:
            continue
        if index > 0 and tokens[index - 1].text in (".", ".?"):
            continue
        if any(scope.start <= index < scope.end for scope in scopes):
            continue
        in_has = index >= 2 and tokens[index - 1].text == "(" and tokens[index - 2].text == "has"
        field, end = _selection(tokens, index)
        following = tokens[index + 1].text if index + 1 < len(tokens) else ""
        found.append(Reference(name, field, token.start, end, in_has,
                               optional=following in (".?", "[?"),
                               indexed=following in ("[", "[?")))
    return tuple(found)


def _selection(tokens: Sequence[Token], index: int) -> tuple[str | None, int]:
    after = tokens[index + 1:index + 4]
    if len(after) >= 2 and after[0].text in (".", ".?"):
        if after[1].kind is TokenKind.IDENT:
            return after[1].text, after[1].end
        if after[1].kind is TokenKind.QUOTED_FIELD:
            return after[1].text.strip("`"), after[1].end
    if len(after) >= 3 and after[0].text in ("[", "[?") and after[2].text == "]" \
            and after[1].kind is TokenKind.STRING:
        literal = _plain_string(after[1].text)
        if literal is not None:
            return literal, after[2].end
    return None, tokens[index].end


_PLAIN_LITERAL = re.compile(r"""^(?:'([A-Za-z0-9_.\-/]*)'|"([A-Za-z0-9_.\-/]*)")$""")


def _plain_string(text: str) -> str | None:
    """The value of a one-line string literal without escapes, else ``None``."""
    match = _PLAIN_LITERAL.match(text)
    return None if match is None else (match[1] if match[1] is not None else match[2])


def fields(source: str, name: str) -> tuple[str, ...]:
    """The members selected from ``name`` (``variables.x`` → ``x``), in order, repeats kept."""
    return tuple(r.field for r in references(source, name) if r.field is not None)


def uses(source: str, name: str) -> bool:
    """Whether ``source`` uses the top-level ``name`` at all."""
    return bool(references(source, name))


def selections_only(source: str, name: str) -> frozenset[str] | None:
    """The members of ``name`` that ``source`` selects plainly (``name.field``), or ``None`` when
    it also uses ``name`` another way (indexed, whole, inside ``has()``, or as an optional
    selection): then a member is not safely replaced by its value."""
    selected: set[str] = set()
    for reference in references(source, name):
        if reference.field is None or reference.in_has or reference.optional \
                or reference.indexed:
            return None
        selected.add(reference.field)
    return frozenset(selected)


def rename(source: str, name: str, write: Callable[[str], str]) -> str:
    """``source`` with each ``name.<field>`` selection replaced by ``write(field)``; comments are
    dropped; everything else is copied as written."""
    text = without_comments(source)
    parts: list[str] = []
    position = 0
    for reference in references(text, name):
        if reference.field is None or reference.indexed or reference.optional:
            continue
        parts.append(text[position:reference.start] + write(reference.field))
        position = reference.end
    parts.append(text[position:])
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class TypedLiteral:
    """One object literal ``Name{...}`` / ``Name.a.b{...}``: ``type_name`` as written (dotted),
    ``start`` / ``end`` the span of that name, ``fields`` the spans of its top-level bare field
    names."""

    type_name: str
    start: int
    end: int
    fields: tuple[tuple[int, int], ...]


def typed_literals(source: str, root: str) -> tuple[TypedLiteral, ...]:
    """Every object literal whose type name is ``root`` or starts with ``root.`` (``Object{``,
    ``Object.spec.template{``: MutatingAdmissionPolicy's apply configurations), outermost
    first by position. A name preceded by ``.`` is a selection, not a type name."""
    tokens = _code(source)
    found = []
    for index, token in enumerate(tokens):
        if token.kind is not TokenKind.IDENT or token.text != root or \
                (index > 0 and tokens[index - 1].text in (".", ".?")):
            continue
        last = index
        while last + 2 < len(tokens) and tokens[last + 1].text == "." and \
                tokens[last + 2].kind is TokenKind.IDENT:
            last += 2
        if last + 1 >= len(tokens) or tokens[last + 1].text != "{":
            continue
        closing = _closing(tokens, last + 1)
        fields = tuple(
            (tokens[inner].start, tokens[inner].end)
            for inner in _top_level(tokens, last + 1, closing)
            if tokens[inner].kind is TokenKind.IDENT and inner + 1 < closing
            and tokens[inner + 1].text == ":" and (
                tokens[inner - 1].text in ("{", ",")  # ``name:``, or an optional ``?name:``
                or (tokens[inner - 1].text == "?" and tokens[inner - 2].text in ("{", ","))))
        name = "".join(t.text for t in tokens[index:last + 1])
        found.append(TypedLiteral(name, token.start, tokens[last].end, fields))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class Call:
    """One call ``callee(args)`` in source: ``name_start`` / ``name_end`` span the function name
    (a member call's ``.`` excluded; a qualified name such as ``format.named`` whole),
    ``end`` is just past the closing parenthesis (``len(source)`` when it is missing),
    ``arguments`` counts the arguments (a member call's receiver not included)."""

    name_start: int
    name_end: int
    end: int
    arguments: int


def calls(source: str, name: str, *, member: bool) -> tuple[Call, ...]:
    """Each call of ``name`` in ``source`` outside strings and comments: member calls
    (``x.validate(...)``) with ``member``, else global ones (``format.named(...)``, the dotted
    ``name`` written as is and not itself selected from something)."""
    tokens = _code(source)
    parts = name.split(".")
    width = 2 * len(parts) - 1
    found: list[Call] = []
    for index in range(len(tokens) - width):
        window = [t.text for t in tokens[index:index + width]]
        if window[::2] != parts or any(t != "." for t in window[1::2]) \
                or tokens[index + width].text != "(":
            continue
        selected = index > 0 and tokens[index - 1].text in (".", ".?")
        if selected != member:
            continue
        opening = index + width
        closing = _closing(tokens, opening)
        end = tokens[closing].end if closing < len(tokens) else len(source)
        arguments = 0 if closing == opening + 1 else \
            len(_top_level_commas(tokens, opening, closing)) + 1
        found.append(Call(tokens[index].start, tokens[index + width - 1].end, end, arguments))
    return tuple(found)


#: Tokens after which ``[`` indexes (``x[0]``) and ``{`` opens a typed object literal.
_OPERAND_END = frozenset({")", "]", "}"})


def _literal_kind(tokens: Sequence[Token]) -> str | None:
    """The CEL type of an element written as one literal (``1``, ``-2.5``, ``3u``, ``'a'``,
    ``b'a'``, ``true``, ``null``), else ``None``."""
    if tokens and tokens[0].text == "-" and len(tokens) == 2 and tokens[1].kind is TokenKind.NUMBER:
        tokens = tokens[1:]
    if len(tokens) != 1:
        return None
    token = tokens[0]
    if token.kind is TokenKind.NUMBER:
        text = token.text.lower()
        if text.endswith("u"):
            return "uint"
        return "double" if not text.startswith("0x") and any(c in text for c in ".e") else "int"
    if token.kind is TokenKind.STRING:
        prefix = token.text[: len(token.text) - len(token.text.lstrip("rRbB"))]
        return "bytes" if "b" in prefix.lower() else "string"
    if token.kind is TokenKind.IDENT and token.text in ("true", "false", "null"):
        return "bool" if token.text != "null" else "null"
    return None


@dataclass(frozen=True, slots=True)
class LiteralElement:
    """An element of a list literal, or a key or value of a map literal, written as a literal:
    its CEL type (``int uint double string bytes bool null``) and start offset."""

    kind: str
    start: int


def aggregate_literals(source: str, exempt: frozenset[str] = frozenset()
                       ) -> tuple[tuple[LiteralElement, ...], ...]:
    """For each list literal, and for the keys and for the values of each map literal, in
    ``source``: the elements written as literals (others, such as ``x + 1``, are left out).
    A literal that is the first argument of a call named in ``exempt`` (``'%s'.format([...])``)
    is left out."""
    tokens = _code(source)
    groups: list[tuple[LiteralElement, ...]] = []
    for index, token in enumerate(tokens):
        before = tokens[index - 1] if index else None
        follows_operand = before is not None and (
            before.kind in (TokenKind.IDENT, TokenKind.STRING, TokenKind.NUMBER,
                            TokenKind.QUOTED_FIELD) or before.text in _OPERAND_END)
        if token.text not in ("[", "{") or follows_operand or (
                index > 1 and before is not None and before.text == "("
                and tokens[index - 2].text in exempt):
            continue
        closing = _closing(tokens, index)
        bounds = [index, *_top_level_commas(tokens, index, closing), closing]
        elements = [tokens[a + 1:b] for a, b in itertools.pairwise(bounds)]
        if token.text == "[":
            groups.append(_literals(elements))
            continue
        keys, values = [], []
        for element in elements:
            colon = next((i for i, t in enumerate(element) if t.text == ":" and not any(
                u.text in ("(", "[", "{", "[?") for u in element[:i])), None)
            if colon is not None:
                keys.append(element[:colon])
                values.append(element[colon + 1:])
        groups += [_literals(keys), _literals(values)]
    return tuple(group for group in groups if len(group) > 1)


def _literals(elements: Sequence[Sequence[Token]]) -> tuple[LiteralElement, ...]:
    found = []
    for element in elements:
        kind = _literal_kind(element)
        if kind is not None:
            found.append(LiteralElement(kind, element[0].start))
    return tuple(found)
