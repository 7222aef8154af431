"""Named load profiles: how many users, how fast they arrive, for how long, and what the run must show.

A profile is a list of stages (cumulative end time, user count, spawn rate) that the locust load shape
follows, a warm-up that the summary leaves out, the server settings to use when the runner starts the
service itself, and the checks that decide the run's exit status.
Users are closed-loop (each sends its next request when the previous one answered; no think time), so
`users` is the number of requests in flight; overload therefore needs a queue smaller than the user count.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class Stage:
    """Until `end_s` seconds after the start, run `users` users, adding or removing `spawn_rate` per second."""

    end_s: float
    users: int
    spawn_rate: float


@dataclass(frozen=True)
class Checks:
    """What a run of the profile must show; a failed check gives a non-zero exit."""

    max_error_rate: float | None = None
    """Highest share of requests that may fail for any reason (rejections included); None = no limit."""
    expect_rejections: bool = False
    """The server must have rejected some requests with 429 / RESOURCE_EXHAUSTED (overload)."""
    max_timeouts: int | None = None
    """Most requests that may end in a timeout (504, DEADLINE_EXCEEDED or a client timeout)."""
    accepted_p99_within_timeout: bool = False
    """Accepted requests' p99 latency must stay under the server's request timeout."""


@dataclass(frozen=True)
class Profile:
    """A named load profile."""

    name: str
    description: str
    stages: tuple[Stage, ...]
    warmup_s: float = 0.0
    """Samples completed before this many seconds are plotted but left out of the summary."""
    server_args: tuple[str, ...] = ()
    """Extra `bertserve serve` options when the runner starts the service (ignored with --host)."""
    request_timeout_s: float = 30.0
    """The server's per-request deadline this profile expects (passed to the service the runner starts)."""
    client_timeout_s: float = 60.0
    """Client-side network timeout of every call."""
    reject_backoff_s: float = 0.0
    """How long a user waits after a 429 / RESOURCE_EXHAUSTED before its next call (clients that back off)."""
    checks: Checks = field(default_factory=Checks)
    driver: str = "locust"
    """`locust` (users following the stages) or `hostile` (`loadtests.hostile.profile`'s phases; its stages only
    describe it)."""

    @property
    def duration_s(self) -> float:
        return self.stages[-1].end_s

    @property
    def max_users(self) -> int:
        return max(stage.users for stage in self.stages)

    def with_overrides(
        self, users: int | None = None, duration_s: float | None = None, spawn_rate: float | None = None
    ) -> Profile:
        """A copy with a single stage's users / duration / spawn rate replaced (checked, ValueError if absurd)."""
        if users is not None and users < 1:
            raise ValueError(f"users must be at least 1, got {users}")
        if duration_s is not None and duration_s <= self.warmup_s:
            raise ValueError(f"duration {duration_s}s must be longer than the profile's warm-up ({self.warmup_s}s)")
        if spawn_rate is not None and spawn_rate <= 0:
            raise ValueError(f"spawn rate must be positive, got {spawn_rate}")
        if users is None and duration_s is None and spawn_rate is None:
            return self
        if len(self.stages) > 1 and (users is not None or spawn_rate is not None):
            raise ValueError(f"profile {self.name!r} has {len(self.stages)} stages: only --duration can be changed")
        if len(self.stages) > 1:
            scale = float(duration_s or self.duration_s) / self.duration_s
            stages = tuple(replace(stage, end_s=stage.end_s * scale) for stage in self.stages)
            return replace(self, stages=stages)
        stage = self.stages[0]
        new_stage = Stage(
            end_s=duration_s if duration_s is not None else stage.end_s,
            users=users if users is not None else stage.users,
            spawn_rate=spawn_rate if spawn_rate is not None else max(stage.spawn_rate, float(users or 0)),
        )
        return replace(self, stages=(new_stage,))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        Profile(
            name="smoke",
            description="4 users for 15 s: every endpoint answers, nothing fails (CI).",
            stages=(Stage(end_s=15, users=4, spawn_rate=4),),
            warmup_s=1.0,
            checks=Checks(max_error_rate=0.0, max_timeouts=0),
        ),
        Profile(
            name="steady",
            description="32 users for 60 s after a 5 s warm-up: the throughput and latency figures.",
            stages=(Stage(end_s=65, users=32, spawn_rate=32),),
            warmup_s=5.0,
            checks=Checks(max_error_rate=0.01),
        ),
        Profile(
            name="ramp",
            description="1 to 64 users in steps of 20 s (1, 4, 8, 16, 32, 64): where latency bends.",
            stages=tuple(
                Stage(end_s=20.0 * (i + 1), users=users, spawn_rate=64) for i, users in enumerate((1, 4, 8, 16, 32, 64))
            ),
            warmup_s=2.0,
            checks=Checks(max_error_rate=0.01),
        ),
        Profile(
            name="overload",
            description="128 users against a queue of 16 and a 2 s deadline for 40 s: the service must reject "
            "(429) rather than time out, and accepted requests keep a p99 within the deadline.",
            stages=(Stage(end_s=45, users=128, spawn_rate=128),),
            warmup_s=5.0,
            server_args=("--max-queue", "16"),
            request_timeout_s=2.0,
            client_timeout_s=10.0,
            reject_backoff_s=0.1,
            checks=Checks(expect_rejections=True, max_timeouts=0, accepted_p99_within_timeout=True),
        ),
        Profile(
            name="hostile",
            description="a hostile client's phases (about 6 minutes): 1,000 distinct values of every numeric "
            "option, maximum-size requests beside small ones, a 500-connection flood, slow clients, malformed "
            "requests; server RSS, small requests' p99 and status codes per phase; exit 4 on a broken bound "
            "(sizes and bounds: --hostile).",
            stages=(Stage(end_s=300, users=8, spawn_rate=8),),
            driver="hostile",
        ),
    )
}


def get_profile(name: str) -> Profile:
    """The profile called `name`; ValueError listing the known ones otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown profile {name!r}; choose one of {', '.join(PROFILES)}") from None
