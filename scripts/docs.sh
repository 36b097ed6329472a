#!/usr/bin/env bash
# The documentation site: docs/ built by MkDocs into build/docs, warnings (a broken link or
# anchor, a docstring it cannot read) as errors. The launch options' table in
# docs/options.md is written from their declaration (jupyter_dist/options.py and each
# backend's own) first.
#   scripts/docs.sh            build it
#   scripts/docs.sh --serve    build it and serve it at http://127.0.0.1:8000 while editing
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x .venv/bin/python ]] || scripts/setup.sh
.venv/bin/python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || {
    log=$(mktemp)
    .venv/bin/python -m pip --disable-pip-version-check -q install -e ".[docs]" >"$log" 2>&1 \
        || { grep -v "^WARNING: Location" "$log"; exit 1; }
    rm -f "$log"
}
.venv/bin/python - <<'PY'
from pathlib import Path

from jupyter_dist.backends import declared_options
from jupyter_dist.options import markdown_table

page = Path("docs/options.md")
text = page.read_text()
start = "<!-- the table: written by scripts/docs.sh from jupyter_dist/options.py -->\n"
end = "<!-- end of the table -->\n"
before, _, rest = text.partition(start)
_, _, after = rest.partition(end)
written = before + start + markdown_table(declared_options()) + end + after
if written != text:
    page.write_text(written)
    print("docs/options.md: the options' table was rewritten from their declaration")
PY
export NO_MKDOCS_2_WARNING=1  # Material's notice about its successor, on every build
if [[ "${1:-}" == "--serve" ]]; then
    exec .venv/bin/mkdocs serve --dev-addr 127.0.0.1:8000
fi
.venv/bin/mkdocs build --strict --quiet
echo "docs: build/docs/index.html"
