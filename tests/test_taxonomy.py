"""The keyword taxonomy as a table of tags to classes, and replacing it by file."""
import json

import pytest

from app import create_app
from app.config import ConfigError
from app.context_store import deriver, taxonomy

SHIPPED = taxonomy.load()


@pytest.mark.parametrize("tags, expected", [
    ([], "other"),
    (["weather", "jokes"], "other"),
    (["shopping"], "commerce"),
    (["Shopping-Cart"], "commerce"),
    (["orders:write"], "commerce"),
    (["kubernetes"], "infrastructure"),
    (["DNS"], "infrastructure"),
    (["meditation"], "wellness"),
    (["bank_account"], "finance"),
    (["exam-prep"], "education"),
    (["dating"], "social"),
    # most tags wins
    (["cart", "checkout", "loan"], "commerce"),
    (["loan", "mortgage", "cart"], "finance"),
    # a tie goes to the class listed first in the file (finance before commerce)
    (["cart", "loan"], "finance"),
    (["social", "homework"], "education"),
    # one tag counts once per class, however many of its words match
    (["shop-cart-checkout", "loan", "credit"], "finance"),
    # words, not substrings: "shopper" is not "shop"
    (["shopper"], "other"),
])
def test_tags_to_class(tags, expected):
    assert SHIPPED.classify(tags) == expected


def test_a_deployment_can_replace_the_taxonomy(tmp_path, monkeypatch):
    path = tmp_path / "taxonomy.json"
    path.write_text(json.dumps({"classes": [
        {"name": "wellness", "keywords": ["tea"]},
        {"name": "commerce", "keywords": ["tea", "cart"]},
    ]}))
    monkeypatch.setenv("TAXONOMY_PATH", str(path))
    replaced = create_app({"SECRET_ENCRYPTION_KEY": None}).extensions["taxonomy"]
    assert replaced.classify(["tea"]) == "wellness"
    assert replaced.classify(["cart"]) == "commerce"
    assert replaced.classify(["kubernetes"]) == "other"


@pytest.mark.parametrize("document", [
    {"classes": []},
    {"classes": [{"name": "gaming", "keywords": ["game"]}]},
    {"classes": [{"name": "other", "keywords": ["x"]}]},
    {"classes": [{"name": "social", "keywords": ["Chat"]}]},
    {"classes": [{"name": "social", "keywords": ["chat"]}, {"name": "social", "keywords": ["x"]}]},
    [1, 2],
])
def test_a_bad_taxonomy_fails_at_start(tmp_path, document):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ConfigError):
        taxonomy.load(str(path))


@pytest.mark.parametrize("token, tags", [
    ("opaque-token-value", []),
    ("not.a.jwt!", []),
    ("eyJhbGciOiJub25lIn0.bm90IGpzb24.sig", []),
    ("eyJhbGciOiJub25lIn0.WzEsMl0.sig", []),
    ("eyJhbGciOiJub25lIn0.eyJzY29wZSI6InJlYWQgd3JpdGUiLCJ0YWdzIjpbImEiLDVdfQ.sig", ["a", "read", "write"]),
])
def test_embedded_deriver(token, tags):
    assert sorted(deriver.tags_from_token(token)) == tags
