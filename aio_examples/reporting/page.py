"""What every HTML page of the reports shares: its style sheet and embedded images."""

import base64
import html
from pathlib import Path

STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;display:block;overflow-x:auto;
font-size:12px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}
td:first-child{text-align:left}img{max-width:100%}.bad{color:#a00}figure{margin:1em 0}"""


def img(path: Path | None, alt: str) -> str:
    """A PNG embedded in the page (the report is one self-contained file)."""
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"><figcaption>' \
           f'{html.escape(alt)}</figcaption></figure>'
