from tally import count_lines, count_words, most_common

TEXT = "the cat\nsat on the mat\n"


def test_words():
    assert count_words(TEXT) == 6


def test_lines():
    assert count_lines(TEXT) == 2
    assert count_lines("no newline") == 1


def test_most_common():
    assert most_common(TEXT) == "the"


def test_tabs_separate_words():
    assert count_words("a\tb") == 2
