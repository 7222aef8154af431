"""The mix syntax and the named profiles."""

from __future__ import annotations

import pytest

from loadtests.endpoints import as_rest, format_mix, parse_mix, protocols, tasks
from loadtests.profiles import PROFILES, get_profile


def test_mix_parses_weights_aliases_and_duplicates() -> None:
    mix = parse_mix("/classify=3, qa, QA.Extract=2,/classify=1,ner=0")
    assert mix == {"/classify": 4, "/qa": 1, "QA.Extract": 2}
    assert protocols(mix) == {"rest", "grpc"}
    assert tasks(mix) == ["classify", "qa"]
    assert format_mix(mix) == "/classify=4,/qa=1,QA.Extract=2"


def test_rest_equivalent_for_the_naive_peer() -> None:
    assert as_rest(parse_mix("QA.Extract=2,/qa=1,Classifier.Classify,NER.Recognize")) == {
        "/qa": 3,
        "/classify": 1,
        "/ner": 1,
    }


def test_embedding_endpoints_and_their_rest_equivalents() -> None:
    mix = parse_mix("embed=2,/v1/embeddings=1,Embedder.Embed=1")
    assert mix == {"/embed": 2, "/v1/embeddings": 1, "Embedder.Embed": 1}
    assert tasks(mix) == ["embed"] and protocols(mix) == {"rest", "grpc"}
    assert as_rest(mix) == {"/embed": 3, "/v1/embeddings": 1}  # the peer serves both REST dialects


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("/summarize=1", "unknown endpoint '/summarize'"),
        ("/classify=x", "not an integer"),
        ("/classify=-1", ">= 0"),
        ("/classify=0", "no endpoint with a positive weight"),
        ("", "no endpoint"),
    ],
)
def test_bad_mix_is_refused_by_name(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mix(text)


def test_profiles_and_their_promises() -> None:
    assert set(PROFILES) == {"smoke", "steady", "ramp", "overload", "hostile"}
    assert get_profile("smoke").duration_s <= 30
    assert get_profile("steady").max_users == 32
    ramp = get_profile("ramp")
    assert [s.users for s in ramp.stages] == sorted(s.users for s in ramp.stages)
    overload = get_profile("overload")
    assert overload.checks.expect_rejections and overload.checks.max_timeouts == 0
    assert "--max-queue" in overload.server_args
    assert get_profile("hostile").driver == "hostile" and get_profile("steady").driver == "locust"
    choices = "smoke, steady, ramp, overload, hostile"
    with pytest.raises(ValueError, match=f"unknown profile 'nope'; choose one of {choices}"):
        get_profile("nope")


def test_profile_overrides() -> None:
    smoke = get_profile("smoke").with_overrides(users=8, duration_s=5)
    assert (smoke.max_users, smoke.duration_s, smoke.stages[0].spawn_rate) == (8, 5, 8)
    ramp = get_profile("ramp").with_overrides(duration_s=60)
    assert ramp.duration_s == 60 and len(ramp.stages) == 6
    with pytest.raises(ValueError, match="only --duration"):
        get_profile("ramp").with_overrides(users=3)
    with pytest.raises(ValueError, match="warm-up"):
        get_profile("steady").with_overrides(duration_s=3)
    with pytest.raises(ValueError, match="at least 1"):
        get_profile("smoke").with_overrides(users=0)
