"""``byteps-prophet settings``: every setting (variable, default, what is valid, what it means), read
from the declarations in ``core/settings.py``; ``--markdown`` prints the README's table and
``--write-readme README.md`` regenerates it between the file's settings-table markers."""
from __future__ import annotations

from pathlib import Path

from byteps_prophet.core.settings import DECLARATIONS, default_text, markdown_table, with_settings_table


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "settings", help="list every setting: variable, default, what is valid, what it means",
        description="Every setting read from the environment into byteps_prophet.core.Settings, from its one "
                    "declaration (byteps_prophet/core/settings.py).")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--markdown", action="store_true", help="print the README's settings table (Markdown)")
    what.add_argument("--write-readme", metavar="README", type=Path,
                      help="regenerate the settings table between the file's settings-table markers")
    p.set_defaults(func=run)


def run(args) -> int:
    if args.write_readme:
        text = args.write_readme.read_text()
        updated = with_settings_table(text)
        if updated != text:
            args.write_readme.write_text(updated)
        print(f"{args.write_readme}: settings table {'rewritten' if updated != text else 'already current'}")
    elif args.markdown:
        print(markdown_table(), end="")
    else:
        for field, declaration in DECLARATIONS.items():
            print(f"{declaration.variable}  (default {default_text(field).strip('`')}; valid: {declaration.valid})\n"
                  f"    {declaration.meaning}")
    return 0
