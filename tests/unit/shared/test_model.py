"""shared/kernel/model.py: the one rule queue, placement and the history apply to an edit of an admission."""

from __future__ import annotations

from shared.kernel.model import elastic_wanted, shrunk
from tests.builders import gang, pod_set


def test_an_edit_shrinks_an_admission_only_where_it_asks_for_fewer_pods():
    admitted = gang(pod_set("head", 1, cpu="1"), pod_set("a", 4, cpu="1"), pod_set("b", 2, cpu="2"),
                    pod_set("submitter", 1, in_gang=False, cpu="500m"))
    submitter = pod_set("submitter", 1, in_gang=False, cpu="500m")
    edits = [
        admitted,                                                                                  # unchanged
        gang(pod_set("head", 1, cpu="1"), pod_set("a", 8, cpu="1"), pod_set("b", 2, cpu="2"), submitter),  # grows
        gang(pod_set("head", 1, cpu="1"), pod_set("a", 1, cpu="1"), pod_set("b", 5, cpu="9"), submitter),  # mixed
        gang(pod_set("head", 1, cpu="1"), pod_set("a", 0, cpu="1")),                 # a suspended, the rest gone
    ]
    assert shrunk(admitted, edits[0]) is None and shrunk(admitted, edits[1]) is None
    mixed = shrunk(admitted, edits[2])
    assert [(ps.name, ps.count, ps.resources["cpu"]) for ps in mixed.pod_sets] == [
        ("head", 1, 1000), ("a", 1, 1000), ("b", 2, 2000), ("submitter", 1, 500)]
    assert mixed.min_member == 4
    gone = shrunk(admitted, edits[3])
    assert [ps.count for ps in gone.pod_sets] == [1, 0, 0, 0] and gone.min_member == 1


def test_elastic_wanted_of_the_admitted_pod_sets_themselves_is_that_of_equal_copies():
    """The identity shortcut (an unedited pod set is the admitted one) answers as the shape test does."""
    def elastic(ps, n):
        return ps.model_copy(update={"elastic": n})

    admitted = gang(pod_set("head", 1, cpu="1"), elastic(pod_set("a", 2, cpu="1"), 3),
                    elastic(pod_set("b", 1, cpu="2", memory="1Gi"), 1), pod_set("submitter", 1, in_gang=False, cpu="500m"))
    copies = admitted.model_copy(update={"pod_sets": tuple(ps.model_copy(deep=True) for ps in admitted.pod_sets)})
    assert all(a is not b and a == b for a, b in zip(admitted.pod_sets, copies.pod_sets))
    assert elastic_wanted(admitted, admitted) == elastic_wanted(admitted, copies) == {"a": 3, "b": 1}
    reshaped = gang(pod_set("head", 1, cpu="1"), elastic(pod_set("a", 2, cpu="2"), 5), admitted.pod_sets[2])
    assert elastic_wanted(admitted, reshaped) == {"b": 1}  # "a" waits for its next admission; "b" is the same object
