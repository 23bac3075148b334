"""The reader thread: a part's blocks come in order, its errors where they are taken, and the
next block is being read while the one before is used."""

from __future__ import annotations

import threading

import pytest

from roles.data.read_ahead import Reader


def test_items_come_in_order_from_several_iterators_at_once():
    reader = Reader()
    try:
        a, b = reader.ahead(iter(range(100))), reader.ahead(iter(range(100, 150)))
        got_a, got_b = [], []
        for _ in range(50):  # taken in turns
            got_a.append(next(a))
            got_b.append(next(b))
        got_a.extend(a)
        assert got_a == list(range(100)) and got_b == list(range(100, 150))
        assert list(b) == []  # ended, and stays ended
    finally:
        reader.close()


def test_an_error_is_raised_where_the_item_is_taken():
    def items():
        yield 1
        raise OSError("disk gone")

    reader = Reader()
    try:
        it = reader.ahead(items())
        assert next(it) == 1
        with pytest.raises(OSError, match="disk gone"):
            next(it)
    finally:
        reader.close()


def test_the_next_item_is_read_on_another_thread_before_it_is_asked_for():
    read = threading.Event()
    threads = []

    def items():
        for n in range(3):
            threads.append(threading.get_ident())
            if n == 1:
                read.set()
            yield n

    reader = Reader()
    try:
        it = reader.ahead(items())
        assert next(it) == 0
        assert read.wait(5)  # item 1 made while nobody asked for it
        assert list(it) == [1, 2]
        assert threading.get_ident() not in threads
    finally:
        reader.close()


def test_depth_items_are_made_before_any_is_taken_and_no_more():
    made = []
    started = threading.Event()

    def items():
        for n in range(10):
            made.append(n)
            if n == 2:
                started.set()
            yield n

    reader = Reader()
    try:
        it = reader.ahead(items(), depth=3)
        assert started.wait(5)
        reader.pool.submit(lambda: None).result()   # the reader has done what it was asked
        assert made == [0, 1, 2]                     # three ahead, not a fourth
        assert next(it) == 0
        reader.pool.submit(lambda: None).result()
        assert made == [0, 1, 2, 3]                  # one taken: one more made
        assert list(it) == list(range(1, 10))
    finally:
        reader.close()


def test_after_an_error_the_iterator_ends_and_the_items_before_it_still_come():
    def items():
        yield 1
        yield 2
        raise OSError("disk gone")

    reader = Reader()
    try:
        it = reader.ahead(items(), depth=4)
        assert next(it) == 1 and next(it) == 2
        with pytest.raises(OSError, match="disk gone"):
            next(it)
        assert list(it) == []
    finally:
        reader.close()
