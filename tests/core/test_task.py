import pytest

from byteps_prophet.core import Task


def test_partition_spreads_rows_with_the_extra_rows_on_the_last_pieces():
    task = Task("w", 3, (10, 100))  # 1000 elements
    pieces = task.partition(300)  # ceil(1000/300) = 4 pieces over 10 rows: 2, 2, 3, 3
    assert [p.rows for p in pieces] == [2, 2, 3, 3]
    assert [(p.row_start, p.row_end) for p in pieces] == [(0, 2), (2, 4), (4, 7), (7, 10)]
    assert [p.priority for p in pieces] == [3000, 3001, 3002, 3003]
    assert sum(p.numel for p in pieces) == task.numel


def test_partition_never_makes_more_pieces_than_rows():
    pieces = Task("w", 0, (3, 1000)).partition(10)
    assert len(pieces) == 3 and all(p.rows == 1 for p in pieces)


def test_small_tensor_is_one_piece_with_the_gradient_name():
    (piece,) = Task("bias", 7, (64,)).partition(1_000_000)
    assert piece.key == "bias" and piece.numel == 64 and piece.root.name == "bias"


def test_scalar_and_one_dimensional_tensors():
    assert Task("s", 0, ()).numel == 1
    pieces = Task("v", 0, (10,)).partition(4)
    assert [p.numel for p in pieces] == [3, 3, 4]
    assert [p.key for p in pieces] == ["v[0:3]", "v[3:6]", "v[6:10]"]


def test_slice_outside_the_rows_is_refused():
    with pytest.raises(ValueError):
        Task("w", 0, (4, 4)).slice(2, 5)


def test_split_head_cuts_an_unsent_slice_in_two():
    task = Task("w", 2, (10, 3))
    piece = task.partition(12)[1]  # rows 3..6 (part 1)
    head = piece.split_head(2)
    assert (head.row_start, head.row_end, head.part, head.priority) == (piece.row_start - 2, piece.row_start, 1, 2001)
    assert (piece.rows, piece.numel, piece.nbytes) == (1, 3, 12) and head.nbytes == 24
    assert head.parent is task and head.key == "w[3:5]"
    with pytest.raises(ValueError):
        piece.split_head(1)  # nothing would be left
