from textcase import (
    camel_to_snake,
    char_frequencies,
    collapse_spaces,
    count_vowels,
    initials,
    is_palindrome,
    kebab_case,
    mask,
    reverse_words,
    snake_to_camel,
    title_case,
    truncate,
)


def test_camel_to_snake():
    assert camel_to_snake("parseHttpRequest") == "parse_http_request"
    assert camel_to_snake("UserName") == "user_name"
    assert camel_to_snake("id") == "id"


def test_camel_to_snake_keeps_acronyms_together():
    assert camel_to_snake("HTTPServer") == "http_server"
    assert camel_to_snake("parseJSONBody") == "parse_json_body"
    assert camel_to_snake("version2Id") == "version2_id"


def test_snake_to_camel():
    assert snake_to_camel("max_line_length") == "maxLineLength"
    assert snake_to_camel("max_line_length", upper_first=True) == "MaxLineLength"
    assert snake_to_camel("name") == "name"


def test_kebab_case():
    assert kebab_case("Hello  big_World") == "hello-big-world"
    assert kebab_case("  already-kebab ") == "already-kebab"


def test_truncate():
    assert truncate("abcdef", 4) == "abc…"
    assert truncate("abc", 4) == "abc"
    assert truncate("abcd", 4) == "abcd"


def test_truncate_with_a_custom_suffix():
    assert truncate("abcdef", 5, suffix="...") == "ab..."
    assert truncate("abcdef", 3, suffix="") == "abc"


def test_count_vowels():
    assert count_vowels("Programming") == 3
    assert count_vowels("AEIOU xyz") == 5
    assert count_vowels("") == 0


def test_is_palindrome():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("")
    assert not is_palindrome("palindrome")


def test_reverse_words():
    assert reverse_words("a  b c") == "c b a"
    assert reverse_words(" one ") == "one"


def test_collapse_spaces():
    assert collapse_spaces("  a \t b\n\nc  ") == "a b c"
    assert collapse_spaces("") == ""


def test_initials():
    assert initials("ada  king lovelace") == "AKL"
    assert initials("Grace") == "G"


def test_title_case():
    assert title_case("the lord of the rings") == "The Lord of the Rings"
    assert title_case("A TALE OF two cities") == "A Tale of Two Cities"


def test_char_frequencies():
    assert char_frequencies("aba b") == {"a": 2, "b": 2}
    assert list(char_frequencies("cab")) == ["c", "a", "b"]
    assert char_frequencies("  ") == {}


def test_mask():
    assert mask("12345678") == "****5678"
    assert mask("abc") == "abc"
    assert mask("secret", visible=0, fill="#") == "######"
