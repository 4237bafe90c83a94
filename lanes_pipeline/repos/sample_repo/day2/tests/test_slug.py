from slug import slugify


def test_slugify_joins_words_with_hyphens():
    assert slugify("Hello, World!") == "hello-world"


def test_slugify_drops_accents():
    assert slugify("Crème brûlée") == "creme-brulee"
