"""A JSON body as a foldable tree: objects and arrays only, every key and value escaped,
bounded in size and depth."""
from __future__ import annotations

import json

from appliance.ui.json_tree import MAX_BYTES, MAX_DEPTH, MAX_NODES, PAGE_NODES, Budget, json_tree


def test_it_shows_an_object_as_nested_details_with_every_value_escaped() -> None:
    tree = json_tree(b'{"<b>k</b>": ["<script>x</script>", 1, 2.5, true, null], "o": {}}')
    assert tree is not None
    assert tree.count("<details open>") == 3 and "<script>" not in tree and "<b>" not in tree
    assert "&quot;&lt;b&gt;k&lt;/b&gt;&quot;" in tree and "&lt;script&gt;x" in tree
    assert '<span class="json-int">1</span>' in tree and '"json-null">null' in tree
    assert "5 items" in tree and "2 keys" in tree and "0 keys" in tree


def test_it_leaves_scalars_text_and_binary_and_oversized_bodies_alone() -> None:
    for body in (b'"a string"', b"42", b"not json", b"\xff\xfe", b"{", b"[1,]"):
        assert json_tree(body) is None, body
    assert json_tree(json.dumps({"a": "x" * MAX_BYTES}).encode()) is None
    assert json_tree(b"[" * (MAX_DEPTH + 2) + b"]" * (MAX_DEPTH + 2)) is None
    assert json_tree(b"[" * 5000 + b"]" * 5000) is None  # past the parser's recursion


def test_a_huge_tree_stops_at_its_node_budget() -> None:
    tree = json_tree(json.dumps(list(range(MAX_NODES * 2))).encode())
    assert tree is not None and tree.count("<li>") < MAX_NODES + 1
    assert '<li class="json-more">…</li>' in tree


def test_a_pages_trees_share_one_budget_and_then_show_as_text() -> None:
    page = Budget()
    body = json.dumps(list(range(MAX_NODES * 2))).encode()
    trees = [json_tree(body, page) for _ in range(PAGE_NODES // MAX_NODES + 2)]
    assert all(t is not None for t in trees[:PAGE_NODES // MAX_NODES])
    assert trees[-1] is None and page.left <= 0
    assert sum(t.count("<li>") for t in trees if t is not None) <= PAGE_NODES
