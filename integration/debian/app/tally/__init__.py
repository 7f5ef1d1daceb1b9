"""Word and line counts of a text."""

SEPARATORS = " \t\n"


def words(text: str) -> list[str]:
    out, current = [], ""
    for ch in text:
        if ch in SEPARATORS:
            if current:
                out.append(current)
            current = ""
        else:
            current += ch
    if current:
        out.append(current)
    return out


def count_words(text: str) -> int:
    return len(words(text))


def count_lines(text: str) -> int:
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def most_common(text: str) -> str:
    seen: dict[str, int] = {}
    for w in words(text.lower()):
        seen[w] = seen.get(w, 0) + 1
    return max(sorted(seen), key=lambda w: seen[w]) if seen else ""
