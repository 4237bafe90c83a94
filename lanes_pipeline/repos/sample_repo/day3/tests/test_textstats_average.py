from textstats import average_word_length


def test_average_word_length():
    assert average_word_length("ab abcd") == 3.0
    assert average_word_length("a bb, ccc!") == 2.0
    assert average_word_length("... 42 !") == 0.0
