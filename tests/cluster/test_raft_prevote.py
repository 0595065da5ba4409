"""The pre-vote rule alone (cluster/raft_prevote.py): who grants, when a seed stands."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cluster.raft_prevote import ANSWER, REQUEST, Campaign, Decision, grants, well_formed

MIN = 0.15  # raftMinTimeout


@pytest.mark.parametrize(
    ("case", "proposed", "candidate_log", "current", "own_log", "leading", "heard_at", "yes"),
    [
        ("no leader heard, log as long", 3, (2, 10), 2, (2, 10), False, None, True),
        ("the leader heard long ago", 3, (2, 10), 2, (2, 10), False, 99.0, True),
        ("heard just at the minimum timeout", 3, (2, 10), 2, (2, 10), False, 100 - MIN, True),
        ("a live leader heard within it", 3, (2, 10), 2, (2, 10), False, 99.9, False),
        ("it leads", 3, (2, 10), 2, (2, 10), True, None, False),
        ("the candidate's last term behind", 3, (1, 50), 2, (2, 10), False, None, False),
        ("its last term ahead, shorter", 3, (3, 1), 2, (2, 10), False, None, True),
        ("same last term, shorter log", 3, (2, 9), 2, (2, 10), False, None, False),
        ("same last term, longer log", 3, (2, 11), 2, (2, 10), False, None, True),
        ("proposed term not above its own", 2, (2, 10), 2, (2, 10), False, None, False),
        ("proposed term below its own", 2, (2, 10), 5, (2, 10), False, None, False),
        ("proposed term far above its own", 9, (2, 10), 2, (2, 10), False, None, True),
    ],
)
def test_who_grants_a_pre_vote(case: str, proposed: int, candidate_log: tuple[int, int],
                               current: int, own_log: tuple[int, int], leading: bool,
                               heard_at: float | None, yes: bool) -> None:
    assert grants(proposed_term=proposed, candidate_log=candidate_log, current_term=current,
                  own_log=own_log, leading=leading, heard_leader_at=heard_at, now=100.0,
                  min_timeout=MIN) is yes, case


@pytest.mark.parametrize(("message", "ok"), [
    ({"type": REQUEST, "term": 3, "round": 1, "last_log_term": 2, "last_log_index": 9}, True),
    ({"type": REQUEST, "term": 3, "last_log_term": 2, "last_log_index": 9}, True),  # no round
    ({"type": REQUEST, "term": 3, "last_log_term": 2}, False),
    ({"type": REQUEST, "term": "3", "last_log_term": 2, "last_log_index": 9}, False),
    ({"type": REQUEST, "term": True, "last_log_term": 2, "last_log_index": 9}, False),
    ({"type": ANSWER, "term": 3, "proposed_term": 3, "granted": True}, True),
    ({"type": ANSWER, "term": 3, "granted": True}, False),
    ({"type": ANSWER, "term": None, "proposed_term": 3, "granted": True}, False),
])
def test_a_message_without_its_integers_is_ignored(message: dict[str, object], ok: bool) -> None:
    assert well_formed(message) is ok


def test_a_majority_of_yes_stands_at_once_and_a_round_of_no_asks_again() -> None:
    campaign = Campaign(cluster_size=5)
    assert campaign.at_deadline(7, "abcd") is Decision.ASK
    assert campaign.ask(7, "abcd") == (8, 1)
    assert not campaign.hear("a", proposed_term=8, granted=True)
    assert not campaign.hear("b", proposed_term=8, granted=False)
    assert campaign.hear("c", proposed_term=8, granted=True)  # 3 of 5
    assert not campaign.hear("d", proposed_term=8, granted=True)  # (had it already)
    assert campaign.at_deadline(7, "abcd") is Decision.STAND
    campaign.stood()
    assert campaign.at_deadline(8, "abcd") is Decision.ASK  # the election failed: again
    assert campaign.ask(8, "abcd") == (9, 2)
    for seed in "abcd":
        campaign.hear(seed, proposed_term=9, granted=False)
    assert campaign.at_deadline(8, "abcd") is Decision.ASK


def test_answers_hold_across_the_rounds_of_a_term_and_the_latest_counts() -> None:
    """A starved seed answers late: its yes after the round's end counts in the next. A
    seed that said no and then lost its leader says yes; one that said yes and then
    heard a leader, no."""
    campaign = Campaign(cluster_size=3)
    campaign.requested_by("b")  # b runs the rule
    campaign.ask(1, "ab")
    assert not campaign.hear("a", proposed_term=2, granted=False)
    campaign.ask(1, "ab")  # round 2, the same term
    assert campaign.at_deadline(1, "ab") is Decision.ASK  # both run the rule: silence is no
    assert campaign.hear("a", proposed_term=2, granted=True)  # changed its mind
    assert campaign.at_deadline(1, "ab") is Decision.STAND
    assert not campaign.hear("a", proposed_term=2, granted=False)
    assert campaign.at_deadline(1, "ab") is Decision.ASK
    assert not campaign.hear("b", proposed_term=3, granted=True)  # another term
    assert not campaign.hear("c", proposed_term=2, granted=True)  # not asked
    assert campaign.at_deadline(1, "ab") is Decision.ASK
    assert campaign.hear("b", proposed_term=2, granted=True)  # late, from round 1
    assert campaign.at_deadline(2, "ab") is Decision.ASK  # the term moved on: yes is void
    campaign.ask(2, "ab")
    assert campaign.answers == {}


def test_a_lost_link_voids_its_answer() -> None:
    campaign = Campaign(cluster_size=3)
    campaign.ask(1, "ab")
    campaign.hear("a", proposed_term=2, granted=True)
    campaign.requested_by("b")
    campaign.link_lost("a")
    assert campaign.at_deadline(1, "b") is Decision.ASK


def test_an_old_seed_that_raises_the_term_every_round_is_still_presumed_old() -> None:
    campaign = Campaign(cluster_size=3)
    campaign.hear("a", proposed_term=9, granted=False)  # a runs the rule
    campaign.ask(3, "ab")
    assert campaign.at_deadline(5, "ab") is Decision.STAND  # b stood twice meanwhile


def test_seeds_that_never_answer_are_taken_for_the_version_before() -> None:
    """A rolling upgrade: a seed of the version before ignores the request; the round
    ends with it counted as a yes -- but only while it never showed the rule on its link."""
    campaign = Campaign(cluster_size=3)
    campaign.ask(4, "ab")
    campaign.hear("a", proposed_term=5, granted=False)  # a new seed: no
    assert campaign.at_deadline(4, "ab") is Decision.STAND  # b silent, presumed old
    assert campaign.fallbacks == 1
    campaign.stood()
    campaign.ask(5, "ab")
    campaign.requested_by("b")  # b asked for a pre-vote itself: it runs the rule
    assert campaign.at_deadline(5, "ab") is Decision.ASK  # its silence is a no now
    campaign.link_lost("b")  # restarted: maybe another version
    assert campaign.at_deadline(5, "ab") is Decision.ASK  # not asked on the new link yet
    campaign.ask(5, "ab")
    assert campaign.at_deadline(5, "ab") is Decision.STAND


def test_a_silent_seed_no_longer_linked_is_not_counted() -> None:
    campaign = Campaign(cluster_size=3)
    campaign.ask(1, "ab")
    assert campaign.at_deadline(1, "a") is Decision.STAND  # a silent and linked (old)
    campaign.ask(1, "ab")
    assert campaign.at_deadline(1, "") is Decision.ASK  # nobody linked who could vote


def test_a_lone_seed_stands() -> None:
    assert Campaign(cluster_size=1).at_deadline(0, ()) is Decision.STAND


SEEDS = "abcd"
events = st.lists(st.one_of(
    st.tuples(st.just("ask"), st.sampled_from([4, 5])),
    st.tuples(st.just("yes"), st.sampled_from(SEEDS), st.sampled_from([5, 6])),
    st.tuples(st.just("no"), st.sampled_from(SEEDS), st.sampled_from([5, 6])),
    st.tuples(st.just("requested"), st.sampled_from(SEEDS)),
    st.tuples(st.just("lost"), st.sampled_from(SEEDS)),
    st.tuples(st.just("stood"),),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(size=st.sampled_from([3, 5]), steps=events, term=st.sampled_from([4, 5]),
       linked=st.sets(st.sampled_from(SEEDS)))
def test_a_seed_stands_only_with_a_majority_of_yes_or_of_silent_old_seeds(
    size: int, steps: list[tuple[object, ...]], term: int, linked: set[str]
) -> None:
    """Whatever arrives in whatever order: a seed stands only if the seeds whose latest
    answer about *term + 1* was yes -- plus, at the end of a round (of any term), the
    linked seeds it asked that never answered and never showed the rule -- make a
    majority; once every seed shows the rule, yes alone. Checked against a plain record
    of the events."""
    peers = SEEDS[: size - 1]
    campaign = Campaign(cluster_size=size)
    shown: set[str] = set()
    proposed: int | None = None
    asked: set[str] = set()
    answers: dict[str, bool] = {}
    for event in steps:
        kind = event[0]
        if kind == "ask":
            if proposed != int(str(event[1])) + 1:
                answers = {}
            proposed = campaign.ask(int(str(event[1])), peers)[0]
            asked = set(peers)
        elif kind in ("yes", "no"):
            seed, about = str(event[1]), int(str(event[2]))
            shown.add(seed)
            campaign.hear(seed, proposed_term=about, granted=kind == "yes")
            if about == proposed and seed in asked:
                answers[seed] = kind == "yes"
        elif kind == "requested":
            shown.add(str(event[1]))
            campaign.requested_by(str(event[1]))
        elif kind == "lost":
            shown.discard(str(event[1]))
            asked.discard(str(event[1]))
            answers.pop(str(event[1]), None)
            campaign.link_lost(str(event[1]))
        else:
            campaign.stood()
            proposed, asked, answers = None, set(), {}
    counted = sum(answers.values()) if proposed == term + 1 else 0  # another term: void
    silent_old = {s for s in asked if s in linked and s not in answers and s not in shown}
    decision = campaign.at_deadline(term, linked)
    majority = (counted + 1) * 2 > size
    with_old = bool(silent_old) and (counted + len(silent_old) + 1) * 2 > size
    assert (decision is Decision.STAND) == (proposed is not None and (majority or with_old))
    if decision is Decision.STAND and not silent_old:
        assert majority  # every asked seed that could answer runs the rule: yes alone
