"""Definitions in source files, found with tree-sitter: what `outline`, `find_symbol` and the
repository map are built from.

Languages: Python, JavaScript (.js .mjs .cjs .jsx), TypeScript (.ts .tsx), Go, Rust — each
through its single-language wheel (`tree_sitter_python`, ...). A *symbol* is a named definition
(class, function, method, struct, enum, trait, interface, type, module, top-level const with an
arrow function) with its kind, 1-based line range and nesting depth.

What it does not do: resolve references or types (that is a language server's job); unknown file
types simply have no symbols.

    >>> [s.name for s in symbols_of("a.py", "class A:\\n    def f(self): pass\\n")]
    ['A', 'f']
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import PurePosixPath

LANGUAGE_OF_SUFFIX = {
    ".py": "python",
    ".pyi": "python",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
    ".jsx": "javascript",
    ".ts": "typescript",
    ".tsx": "tsx",
    ".go": "go",
    ".rs": "rust",
}

# node type -> kind shown to the model
_DEFINITIONS = {
    "class_definition": "class",
    "function_definition": "function",
    "class_declaration": "class",
    "abstract_class_declaration": "class",
    "function_declaration": "function",
    "generator_function_declaration": "function",
    "method_definition": "method",
    "interface_declaration": "interface",
    "type_alias_declaration": "type",
    "enum_declaration": "enum",
    "method_declaration": "method",
    "type_spec": "type",
    "function_item": "function",
    "struct_item": "struct",
    "enum_item": "enum",
    "trait_item": "trait",
    "mod_item": "module",
    "type_item": "type",
    "const_item": "const",
    "macro_definition": "macro",
}
# Containers whose children are definitions but which have no name field of their own.
_NAMED_BY_TYPE = {"impl_item": "impl"}
_ARROW_VALUES = {"arrow_function", "function_expression", "function"}


@dataclass(frozen=True)
class Symbol:
    name: str
    kind: str  # class | function | method | struct | enum | trait | interface | type | ...
    start_line: int  # 1-based, inclusive
    end_line: int  # 1-based, inclusive
    depth: int  # 0 for top-level definitions
    signature: str  # the definition's first line, stripped and capped

    def render(self) -> str:
        return (
            f"{'  ' * self.depth}{self.kind} {self.name}  (lines {self.start_line}-{self.end_line})"
        )


def language_of(path: str) -> str | None:
    return LANGUAGE_OF_SUFFIX.get(PurePosixPath(path).suffix.lower())


@cache
def _parser(language: str):
    from tree_sitter import Language, Parser

    if language == "python":
        import tree_sitter_python as mod

        lang = mod.language()
    elif language == "javascript":
        import tree_sitter_javascript as mod

        lang = mod.language()
    elif language in ("typescript", "tsx"):
        import tree_sitter_typescript as mod

        lang = mod.language_tsx() if language == "tsx" else mod.language_typescript()
    elif language == "go":
        import tree_sitter_go as mod

        lang = mod.language()
    elif language == "rust":
        import tree_sitter_rust as mod

        lang = mod.language()
    else:
        raise ValueError(f"no tree-sitter grammar for {language!r}")
    return Parser(Language(lang))


def symbols_of(path: str, text: str) -> list[Symbol]:
    """Every definition in `text` (a file at `path`), in source order."""
    language = language_of(path)
    if language is None:
        return []
    data = text.encode("utf-8", errors="surrogateescape")
    tree = _parser(language).parse(data)
    lines = data.split(b"\n")
    out: list[Symbol] = []

    def add(node, name: str, kind: str, depth: int) -> None:
        row = node.start_point[0]
        first = lines[row].decode("utf-8", "replace").strip() if row < len(lines) else ""
        out.append(Symbol(name, kind, row + 1, node.end_point[0] + 1, depth, first[:160]))

    def walk(node, depth: int) -> None:
        for child in node.named_children:
            kind = _DEFINITIONS.get(child.type)
            name_node = child.child_by_field_name("name")
            if kind and name_node is not None:
                add(child, name_node.text.decode("utf-8", "replace"), kind, depth)
                walk(child, depth + 1)
            elif child.type in _NAMED_BY_TYPE:
                type_node = child.child_by_field_name("type")
                label = type_node.text.decode("utf-8", "replace") if type_node else "?"
                add(child, label, _NAMED_BY_TYPE[child.type], depth)
                walk(child, depth + 1)
            elif child.type == "variable_declarator" and _is_function_value(child):
                add(child, name_node.text.decode("utf-8", "replace"), "function", depth)
            elif child.type in (
                "decorated_definition",
                "export_statement",
                "lexical_declaration",
                "variable_declaration",
                "type_declaration",
                "declaration_list",
                "class_body",
                "block",
                "body",
                "statement_block",
                "program",
                "module",
                "source_file",
            ):
                walk(child, depth)

    walk(tree.root_node, 0)
    return out


def _is_function_value(node) -> bool:
    value = node.child_by_field_name("value")
    name = node.child_by_field_name("name")
    return value is not None and name is not None and value.type in _ARROW_VALUES
