"""A small DOM of an HTML page read with the standard library's html.parser, for the HTML report's tests:
elements with their attributes, children and text, found by tag and attributes; `errors` lists every end
tag that closed something else than the element open (a page whose tags do not balance)."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Iterator

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track",
                  "wbr"})


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: "Node | None") -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    @property
    def text(self) -> str:
        """The text inside, as a browser's textContent (hidden elements' included)."""
        return "".join(c if isinstance(c, str) else c.text for c in self.children)

    def walk(self) -> Iterator["Node"]:
        for child in self.children:
            if isinstance(child, Node):
                yield child
                yield from child.walk()

    def find_all(self, tag: str | None = None, **attrs: str | bool) -> list["Node"]:
        """Descendants of `tag` (any if None) with each attribute (`data_field="cause"` is data-field;
        True: present with any value)."""
        wanted = {name.replace("_", "-"): value for name, value in attrs.items()}
        return [n for n in self.walk() if (tag is None or n.tag == tag) and all(
            (name in n.attrs) if value is True else n.attrs.get(name) == value for name, value in wanted.items())]

    def find(self, tag: str | None = None, **attrs: str | bool) -> "Node":
        found = self.find_all(tag, **attrs)
        assert len(found) == 1, f"{len(found)} <{tag or '*'} {attrs}> where one was expected"
        return found[0]

    def field(self, name: str) -> str:
        """The text of the one element with data-field=`name` inside this one."""
        return self.find(data_field=name).text


class _Builder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.open = [self.root]
        self.errors: list[str] = []
        self.doctype: str | None = None

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs), self.open[-1])
        self.open[-1].children.append(node)
        if tag not in VOID:
            self.open.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.open[-1].children.append(Node(tag, dict(attrs), self.open[-1]))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if self.open[-1].tag != tag:
            self.errors.append(f"</{tag}> closes <{self.open[-1].tag}>")
            if not any(n.tag == tag for n in self.open[1:]):
                return
        while self.open[-1].tag != tag:
            self.open.pop()
        self.open.pop()

    def handle_data(self, data: str) -> None:
        self.open[-1].children.append(data)


class Page:
    """A parsed page: `root`, the `doctype`, and the `errors` of its nesting (none for a page that balances)."""

    def __init__(self, source: str) -> None:
        builder = _Builder()
        builder.feed(source)
        builder.close()
        self.root, self.doctype = builder.root, builder.doctype
        self.errors = builder.errors + [f"<{n.tag}> never closed" for n in builder.open[1:]]

    def findings(self) -> list[Node]:
        return self.root.find_all(data_finding=True)

    def finding(self, cause: str) -> Node:
        return self.root.find(data_cause=cause)
