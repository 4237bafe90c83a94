from slug import slugify, unique_slug


def test_slugify_joins_words_with_hyphens():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_drops_accents():
    assert slugify("Crème brûlée") == "creme-brulee"


def test_unique_slug_counts_up():
    assert unique_slug("A b", {"a-b", "a-b-2"}) == "a-b-3"
