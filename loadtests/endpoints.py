"""The endpoints a load test can call and the weighted mix syntax (`/classify=3,/qa=1,QA.Extract=1`).

REST endpoints are the service's paths; gRPC endpoints are `Service.Method` of the bert.v1 contract
(proto/bert/v1/bert.proto). Each belongs to one task, which decides the payload it is sent.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Endpoint:
    name: str
    protocol: str
    """`rest` or `grpc`."""
    task: str
    """`classify`, `qa`, `ner`, `embed` or `rerank`: which payloads it takes and which model serves it."""


ENDPOINTS: dict[str, Endpoint] = {
    e.name: e
    for e in (
        Endpoint("/classify", "rest", "classify"),
        Endpoint("/qa", "rest", "qa"),
        Endpoint("/ner", "rest", "ner"),
        Endpoint("/embed", "rest", "embed"),
        Endpoint("/v1/embeddings", "rest", "embed"),
        Endpoint("/rerank", "rest", "rerank"),
        Endpoint("/v1/rerank", "rest", "rerank"),
        Endpoint("Classifier.Classify", "grpc", "classify"),
        Endpoint("QA.Extract", "grpc", "qa"),
        Endpoint("NER.Recognize", "grpc", "ner"),
        Endpoint("Embedder.Embed", "grpc", "embed"),
        Endpoint("Reranker.Rerank", "grpc", "rerank"),
    )
}
ALIASES = {"classify": "/classify", "qa": "/qa", "ner": "/ner", "embed": "/embed", "rerank": "/rerank"}
REST_OF_TASK = {"classify": "/classify", "qa": "/qa", "ner": "/ner", "embed": "/embed", "rerank": "/rerank"}
DEFAULT_MIX = "/classify=1,/qa=1,/ner=1"

Mix = dict[str, int]
"""Endpoint name -> relative weight (each user picks its next call with these weights)."""


def parse_mix(text: str) -> Mix:
    """`/classify=3,/qa=1` -> {"/classify": 3, "/qa": 1}; a bare name means weight 1. ValueError names the problem."""
    mix: Mix = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, weight_text = item.partition("=")
        name = ALIASES.get(name.strip(), name.strip())
        if name not in ENDPOINTS:
            raise ValueError(f"unknown endpoint {name!r} in --mix; choose from {', '.join(ENDPOINTS)}")
        try:
            weight = int(weight_text) if sep else 1
        except ValueError:
            raise ValueError(f"weight {weight_text!r} of {name} in --mix is not an integer") from None
        if weight < 0:
            raise ValueError(f"weight of {name} in --mix must be >= 0, got {weight}")
        if weight:
            mix[name] = mix.get(name, 0) + weight
    if not mix:
        raise ValueError(f"--mix {text!r} names no endpoint with a positive weight")
    return mix


def format_mix(mix: Mix) -> str:
    return ",".join(f"{name}={weight}" for name, weight in mix.items())


def protocols(mix: Mix) -> set[str]:
    return {ENDPOINTS[name].protocol for name in mix}


def tasks(mix: Mix) -> list[str]:
    """The tasks the mix needs, in first-use order."""
    seen: list[str] = []
    for name in mix:
        task = ENDPOINTS[name].task
        if task not in seen:
            seen.append(task)
    return seen


def as_rest(mix: Mix) -> Mix:
    """The same mix over REST only (for the naive peer, which has no gRPC front door)."""
    rest: Mix = {}
    for name, weight in mix.items():
        rest_name = name if ENDPOINTS[name].protocol == "rest" else REST_OF_TASK[ENDPOINTS[name].task]
        rest[rest_name] = rest.get(rest_name, 0) + weight
    return rest
