from textstats import top_words, word_count, words


def test_words_are_lower_case():
    assert words("Hello World") == ["hello", "world"]


def test_word_count():
    assert word_count("one two, three!") == 3


def test_top_words_breaks_ties_alphabetically():
    assert top_words("b a b a c", 2) == [("a", 2), ("b", 2)]
