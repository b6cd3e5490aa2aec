import pytest

from caiplatform.errors import BadRequest
from caiplatform.pagination import PAGE_SIZE_MESSAGE, PAGE_TOKEN_MESSAGE, Pager, page_body

pager = Pager(b"k" * 32)


@pytest.mark.parametrize("raw", [0, 201, -1, "x", "1.5", 2.5])
def test_page_size_out_of_range_is_rejected_never_clamped(raw):
    with pytest.raises(BadRequest) as err:
        pager.request("agents", raw)
    assert err.value.message == PAGE_SIZE_MESSAGE


def test_default_and_bounds():
    assert pager.request("l").size == 50
    assert pager.request("l", "1").size == 1
    assert pager.request("l", 200).size == 200


def test_walks_every_item_once():
    items = list(range(7))
    seen, token = [], ""
    while True:
        page = pager.page(items, pager.request("l", 3, token))
        seen += page.items
        token = page.next_page_token
        if not token:
            break
    assert seen == items


def test_token_is_bound_to_its_list_and_tamper_evident():
    token = pager.page(list(range(10)), pager.request("list-a", 2)).next_page_token
    assert pager.request("list-a", 2, token).offset == 2
    for bad_list, bad_token in [("list-b", token), ("list-a", token[:-2] + "xx"), ("list-a", "garbage")]:
        with pytest.raises(BadRequest) as err:
            pager.request(bad_list, 2, bad_token)
        assert err.value.message == PAGE_TOKEN_MESSAGE
    assert Pager(b"other" * 8).request("list-a", 2, None).offset == 0
    with pytest.raises(BadRequest):
        Pager(b"other" * 8).request("list-a", 2, token)


def test_page_body_token_presence():
    last = pager.page([1], pager.request("l"))
    assert page_body("agents", last) == {"agents": [1], "next_page_token": ""}
    assert page_body("topics", last, omit_empty_token=True) == {"topics": [1]}
