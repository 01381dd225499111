"""mkdocs hook: README.md is the site's home page, so it is written once and shown in both places.

Its links point into docs/ (`docs/queue.md`) because GitHub renders it from the project root; on the
site the page lives inside docs/, so those links lose the prefix.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files


def on_files(files: Files, config: Any) -> Files:
    readme = Path(config.config_file_path).parent / "README.md"
    text = re.sub(r"\]\(docs/", "](", readme.read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files
