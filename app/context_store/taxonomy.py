"""Semantic tags to intent class, through a keyword taxonomy kept as data.

Rule: a tag is split into lowercase words (on anything that is not a letter or digit); it counts
once for every class that has one of those words as a keyword. The class with the most tags wins;
a tie goes to the class listed first in the taxonomy file. No tag counted: `other`.
"""
import json
import re
from importlib import resources

from app import master_files
from app.config import ConfigError

INTENT_CLASSES = ("commerce", "infrastructure", "wellness", "finance", "education", "social", "other")
FALLBACK_CLASS = "other"
_WORD = re.compile(r"[a-z0-9]+")


class Taxonomy:
    def __init__(self, classes):
        """`classes` is a list of (name, keywords) in tie-break order."""
        self.order = [name for name, _ in classes]
        self.keyword_classes = {}
        for name, keywords in classes:
            for keyword in keywords:
                self.keyword_classes.setdefault(keyword, set()).add(name)

    def classify(self, tags):
        scores = dict.fromkeys(self.order, 0)
        for tag in tags:
            matched = set()
            for word in _WORD.findall(tag.lower()):
                matched |= self.keyword_classes.get(word, set())
            for name in matched:
                scores[name] += 1
        best = max(scores.values(), default=0)
        if best == 0:
            return FALLBACK_CLASS
        return next(name for name in self.order if scores[name] == best)


def load(path=None):
    """Load and check a taxonomy file (the shipped one when `path` is None)."""
    try:
        if path is None:
            text = resources.files("app.context_store").joinpath("taxonomy.json").read_text()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        document = json.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"TAXONOMY_PATH cannot be read as JSON: {exc}") from None
    return Taxonomy(_checked_classes(document))


def _checked_classes(document):
    entries = document.get("classes") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConfigError("taxonomy must be an object with a non-empty list 'classes'")
    classes, seen = [], set()
    for entry in entries:
        name = entry.get("name") if isinstance(entry, dict) else None
        keywords = entry.get("keywords") if isinstance(entry, dict) else None
        if name not in INTENT_CLASSES or name == FALLBACK_CLASS or name in seen:
            raise ConfigError(f"taxonomy class {name!r} is not a distinct intent class")
        if not isinstance(keywords, list) or not all(
            isinstance(word, str) and _WORD.fullmatch(word) for word in keywords
        ):
            raise ConfigError(f"taxonomy class {name!r} needs a list of lowercase keywords")
        seen.add(name)
        classes.append((name, keywords))
    return classes


def init_app(app):
    """The taxonomy gunicorn's master read (app.master_files), or the file's, read now."""
    path = app.config["TAXONOMY_PATH"]
    app.extensions["taxonomy"] = master_files.inherited("taxonomy", path, lambda: load(path))
