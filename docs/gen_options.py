"""Write docs/options.md from the option list (`leakdoctor.settings.OPTIONS`), so that every option is
documented once, from its definition. Run `python docs/gen_options.py` after changing an option;
tests/test_docs.py checks that the page in the repository is the one this writes."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "options.md"

INTRO = """# Options

Every doctor and callback takes the same options, as keyword arguments. So do `leakdoctor run -o
NAME=VALUE` and the pytest plugin's `leak_check(...)` and `@pytest.mark.leakcheck(...)`. They are defined
once, in `leakdoctor.settings.OPTIONS`. `docs/gen_options.py` generates this page from it. `help()` on any doctor or callback
lists them too.

Everything is checked at construction. A bad value is a `ValueError` that names it and the valid values. A
misspelt name is an `UnknownOptionError` that suggests the nearest name. The arguments each entry point
takes beside the options are in [Frameworks](frameworks.md#arguments-beside-the-options).

"""


def page() -> str:
    """The whole options page: a short introduction, then the table generated from the option list."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from leakdoctor.settings import options_table

    return INTRO + options_table() + "\n"


def main() -> None:
    PAGE.write_text(page(), encoding="utf-8")
    print(f"wrote {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
