"""Readable tables for reports: the CLI's and the benchmark scripts'."""

__all__ = ["markdown_table", "key_value_table"]


def markdown_table(rows, headers):
    """A Markdown table of ``rows`` (dicts), one column per header, in that order."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(row[h]) for h in headers) + " |" for row in rows]
    return "\n".join(lines)


def key_value_table(pairs):
    """Two aligned columns: a name and its value per line."""
    width = max(len(key) for key, _ in pairs)
    return "\n".join(f"{key:<{width}}  {value}" for key, value in pairs)
