"""Stop sequences on streamed text: held-back partial matches, stops split across pieces, no stop emitted."""

from __future__ import annotations

import pytest

from tilepilot.serve.stops import StopMatcher


def feed(stops, pieces):
    m = StopMatcher(stops)
    out, hit = [], False
    for p in pieces:
        text, hit = m.push(p)
        out.append(text)
        if hit:
            break
    if not hit:
        out.append(m.flush())
    return "".join(out), hit, out


def test_stop_split_across_pieces_is_found_and_not_emitted():
    text, hit, out = feed(["\n\n"], ["Hello", "\n", "\n", "world"])
    assert (text, hit) == ("Hello", True)
    assert out[1] == ""  # the lone "\n" was held back: it could have been the start of the stop


def test_held_back_text_is_released_when_it_is_not_a_stop():
    text, hit, out = feed(["END"], ["abc E", "N", "x"])
    assert (text, hit) == ("abc ENx", False)
    assert out[0] == "abc " and out[1] == ""


def test_earliest_of_several_stops_wins_and_flush_releases_the_tail():
    assert feed(["yy", "x"], ["aaxbbyy"])[:2] == ("aa", True)
    assert feed(["stop"], ["no st"])[:2] == ("no st", False)


@pytest.mark.parametrize("pieces", [["abcdef"], list("abcdef"), ["ab", "cd", "ef"]])
def test_streamed_pieces_concatenate_to_the_unsplit_result(pieces):
    assert feed(["cd"], pieces)[:2] == ("ab", True)
    assert feed([], pieces)[:2] == ("abcdef", False)
