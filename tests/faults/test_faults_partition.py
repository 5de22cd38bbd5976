"""The fault matrix, Postgres side: a node cut off from the database, and a node whose
database connections are terminated, under write load, against real ``sessionhub serve``
processes and a real Postgres.

A partitioned node (its bytes held by a :class:`~tests.support.faultkit.TcpProxy`, its connections
open) leaves transactions "idle in transaction" on the server, holding the sessions'
advisory locks. The server is configured as a stock one is at its worst
(``idle_in_transaction_session_timeout=0``, ``tcp_keepalives_idle=7200``): the hub's own
connection settings (``hub/store/postgres/timeouts.py``) must end those transactions so
that the healthy node's writes to the same sessions go on, and the partitioned node's
clients must get ``unavailable`` instead of waiting. Each test prints its figures
(``pytest -s``) and asserts that no acknowledged append is lost and no log has a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import asyncpg
import httpx2
import pytest

from clients import ConnectionLost, HubClient
from hub import PostgresStore
from hub.store import session_stream
from hub.store.postgres.timeouts import SERVER_DEFAULTS
from protocol import SessionHubError, StoreUnavailable
from tests.support.faultkit import TcpProxy, scratch_postgres
from tests.support.hubtest import Client
from tests.support.nodes import Node, scratch_database
from tests.support.services import postgres_dsn

#: A stock server's settings, the worst case for a partition: nothing ends an idle
#: transaction, and a vanished peer is probed only after two hours.
UNSAFE_SERVER = {
    "idle_in_transaction_session_timeout": "0",
    "statement_timeout": "0",
    "lock_timeout": "0",
    "tcp_keepalives_idle": "7200",
}
#: The hub's default, which frees the partitioned node's locks.
IDLE_TIMEOUT = float(SERVER_DEFAULTS["idle_in_transaction_session_timeout"].rstrip("s"))
#: Node A's client timeout, short so the test is too; its default is 35 s.
COMMAND_TIMEOUT = 3.0
#: Node A closes its WebSockets (1013) after this many seconds without its database.
OUTAGE_CLOSE = 4.0
#: How long A stays cut off: past IDLE_TIMEOUT + MARGIN, so that a healthy node blocked
#: until the partition ends fails the bound below.
HOLD = 12.0
#: Slack for a loaded 2-core machine, on top of the configured timeouts.
MARGIN = 5.0


@dataclass
class Answer:
    at: float
    took: float
    error: SessionHubError | None = None


@dataclass
class Ledger:
    """Every append's id and what its writer was told."""

    answers: dict[str, Answer] = field(default_factory=dict)

    def acknowledged(self) -> set[str]:
        return {mid for mid, a in self.answers.items() if a.error is None}

    def refused(self) -> dict[str, SessionHubError]:
        return {mid: a.error for mid, a in self.answers.items() if a.error is not None}

    def ack_times(self, prefix: str) -> list[float]:
        return sorted(a.at for mid, a in self.answers.items() if a.error is None and mid.startswith(prefix))


async def write_until(client: HubClient, sid: str, prefix: str, ledger: Ledger, stop: asyncio.Event) -> None:
    """Append ``prefix-0``, ``prefix-1``, ... to ``sid`` until ``stop``, one at a time."""
    n = 0
    while not stop.is_set():
        mid = f"{prefix}-{n}"
        n += 1
        start = time.monotonic()
        try:
            await client.sessions.append(
                sid, {"id": mid, "role": "user", "parts": [{"type": "text", "text": mid}]}
            )
            ledger.answers[mid] = Answer(time.monotonic(), time.monotonic() - start)
        except SessionHubError as exc:
            ledger.answers[mid] = Answer(time.monotonic(), time.monotonic() - start, exc)
            await asyncio.sleep(0.05)  # a writer that was refused retries, not spins


def longest_stall(times: list[float], since: float, until: float) -> float:
    """The longest time in ``[since, until]`` with no acknowledgement among ``times``."""
    marks = [since, *(t for t in times if since < t < until), until]
    return max(b - a for a, b in itertools.pairwise(marks))


@dataclass
class Audit:
    acknowledged: int
    lost: int
    gaps: int
    duplicates: int
    answered_but_stored: int
    unknown_outcome: int
    unknown_stored: int
    internal: int


async def audit(dsn: str, sids: Iterable[str], ledger: Ledger) -> Audit:
    """Read every session's log back from the database and hold it against the ledger."""
    stored: list[str] = []
    gaps = 0
    store = await PostgresStore.connect(dsn)
    try:
        for sid in sids:
            events, after = [], 0
            while batch := await store.read_events(session_stream(sid), after, 1000):
                events += batch
                after = batch[-1].seq
            gaps += sum(b.seq - a.seq - 1 for a, b in itertools.pairwise(events))
            gaps += events[0].seq - 1 if events else 0
            stored += [e.data["message"]["id"] for e in events if e.type == "message.appended"]
    finally:
        await store.close()
    present = set(stored)
    acked = ledger.acknowledged()
    refused = ledger.refused()

    def unknown(exc: SessionHubError) -> bool:
        # A request whose socket closed before its answer may have been done, or not.
        return isinstance(exc, ConnectionLost) or (
            isinstance(exc, StoreUnavailable) and exc.outcome == "unknown"
        )

    # `internal` claims a rollback too, but what becomes of it is the driver errors' fix
    # (item 14): counted apart, and shown.
    return Audit(
        acknowledged=len(acked),
        lost=len(acked - present),
        gaps=gaps,
        duplicates=len(stored) - len(present),
        answered_but_stored=sum(
            1 for mid, e in refused.items() if mid in present and not unknown(e) and e.code != "internal"
        ),
        unknown_outcome=sum(1 for e in refused.values() if unknown(e)),
        unknown_stored=sum(1 for mid, e in refused.items() if unknown(e) and mid in present),
        internal=sum(1 for e in refused.values() if e.code == "internal"),
    )


def show(title: str, figures: dict[str, object]) -> None:
    print(
        f"\n{title}: "
        + ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items())
    )


async def probe_health(port: int, stop: asyncio.Event, worst: list[float]) -> None:
    """Poll ``/healthz``; the slowest answer (or wait) into ``worst[0]``."""
    async with httpx2.AsyncClient(timeout=60) as http:
        while not stop.is_set():
            start = time.monotonic()
            with contextlib.suppress(httpx2.HTTPError):
                await http.get(f"http://127.0.0.1:{port}/healthz")
            worst[0] = max(worst[0], time.monotonic() - start)
            await asyncio.sleep(0.2)


#: Node A's connections name themselves, so the test can see what they hold.
A_NAME = "node-a"


async def hold_while_locking(proxy: TcpProxy, admin: asyncpg.Connection) -> int:
    """Hold the proxy at a moment node A's server processes hold a session's advisory lock
    (a write between its BEGIN and its COMMIT): the partition that blocks other nodes.
    Retried until it is one; returns how many session locks A holds."""
    for _ in range(200):
        proxy.hold()
        await asyncio.sleep(0.1)  # what was already on its way to the server lands
        locks = int(
            await admin.fetchval(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
                "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = $1",
                A_NAME,
            )
        )
        if locks:
            return locks
        proxy.release()
        await asyncio.sleep(0.05)
    raise AssertionError("node A never held a session lock")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("end", ["release", "cut"])
async def test_a_node_cut_off_from_postgres_does_not_block_the_healthy_one(end: str) -> None:
    """Writers on node A (through a proxy) and node B (direct) append to the same sessions;
    the proxy holds A's bytes for HOLD seconds, then lets them go (``release``) or resets
    every connection (``cut``). B's writes to the shared sessions must resume within the
    idle-in-transaction timeout (plus a margin), not when the partition ends; A's writers
    must be answered ``unavailable`` within their timeouts; nothing acknowledged is lost."""
    async with scratch_postgres(UNSAFE_SERVER) as pg, TcpProxy(("127.0.0.1", pg.port)) as proxy:
        a_dsn = (
            f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres"
            f"?command_timeout={COMMAND_TIMEOUT}&application_name={A_NAME}"
        )
        admin = await asyncpg.connect(pg.dsn)
        async with (
            Node(a_dsn, None, None, "--store-outage-close", str(OUTAGE_CLOSE)) as a,
            Node(pg.dsn) as b,
            HubClient(a.ws_url, max_backoff=0.5) as on_a,
            Client.connect(a.ws_url) as idle_on_a,
            HubClient(b.ws_url) as on_b,
        ):
            shared = [(await on_b.sessions.create(f"shared {i}")).id for i in range(2)]
            own = (await on_b.sessions.create("B's own")).id
            a_own = (await on_a.sessions.create("A's own")).id
            ledger, stop = Ledger(), asyncio.Event()
            # One writer of A per shared session: each more write of A queued on a session's
            # lock holds it for one more idle timeout (up to lock_timeout; docs/postgres.md).
            writers = [
                *(write_until(on_a, sid, f"a{i}", ledger, stop) for i, sid in enumerate([*shared, a_own])),
                *(write_until(on_b, sid, f"b{i}", ledger, stop) for i, sid in enumerate(shared)),
                write_until(on_b, own, "own", ledger, stop),
            ]
            health: list[float] = [0.0]
            tasks = [asyncio.create_task(w) for w in [*writers, probe_health(b.port, stop, health)]]
            try:
                await asyncio.sleep(1.0)  # load before the fault
                locks = await hold_while_locking(proxy, admin)
                held = time.monotonic()
                # Cut off for a while, A sends its clients elsewhere, and the new ones too.
                code, _ = await idle_on_a.wait_closed(timeout=HOLD)
                sent_away = time.monotonic() - held
                async with Client.connect(a.ws_url) as newcomer:
                    code_new, _ = await newcomer.wait_closed(timeout=5)
                await asyncio.sleep(held + HOLD - time.monotonic())
                freed = time.monotonic()
                if end == "cut":
                    proxy.cut()
                proxy.release()
                async with asyncio.timeout(30):
                    while not any(t > freed for t in ledger.ack_times("a")):
                        await asyncio.sleep(0.02)
                await asyncio.sleep(0.5)  # load after the recovery
            finally:
                stop.set()
                async with asyncio.timeout(30):  # every writer answered: none hangs
                    await asyncio.gather(*tasks)
        await admin.close()
        report = await audit(pg.dsn, [*shared, own, a_own], ledger)

    shared_b = [*ledger.ack_times("b0"), *ledger.ack_times("b1")]
    b_stall = max(longest_stall(ledger.ack_times(p), held, freed) for p in ("b0", "b1"))
    own_stall = longest_stall(ledger.ack_times("own"), held, freed)
    a_answers = [ans for mid, ans in ledger.answers.items() if mid.startswith("a") and held < ans.at < freed]
    a_slowest = max((ans.took for ans in a_answers), default=0.0)
    a_codes = sorted({type(ans.error).__name__ if ans.error else "ok" for ans in a_answers})
    recovered = min(t for t in ledger.ack_times("a") if t > freed) - freed
    show(
        f"node A cut off from Postgres for {HOLD:.0f} s, then {end}",
        {
            **vars(report),
            "session locks A held": locks,
            "B's shared-session writes stalled s": b_stall,
            "B's own-session writes stalled s": own_stall,
            "B's slowest /healthz s": health[0],
            "A's answers during the cut": len(a_answers),
            "A's slowest answer s": a_slowest,
            "A's answers": "/".join(a_codes),
            "A closed its sockets after s": sent_away,
            "A recovered after s": recovered,
        },
    )
    assert (report.lost, report.gaps, report.duplicates, report.answered_but_stored) == (0, 0, 0, 0)
    # The behaviour under test: the partitioned node's locks are freed by the server.
    assert b_stall < IDLE_TIMEOUT + MARGIN, f"B's writes to the shared sessions stalled {b_stall:.1f} s"
    assert any(held < t < freed for t in shared_b)
    # A's clients are told, within their timeouts, instead of waiting for the partition to end.
    assert a_answers and set(a_codes) <= {"ok", "StoreUnavailable", "ConnectionLost"}
    assert "StoreUnavailable" in a_codes
    assert (code, code_new) == (1013, 1013)
    assert sent_away < OUTAGE_CLOSE + 2 * COMMAND_TIMEOUT + MARGIN
    assert a_slowest < 2 * COMMAND_TIMEOUT + MARGIN


@pytest.mark.timeout(120)
async def test_the_writer_nodes_postgres_connections_terminated_under_load() -> None:
    """Every server process of the writer node's pool is ended (``pg_terminate_backend``)
    five times while four writers append: nothing acknowledged is lost, no log has a gap,
    every append is answered, and the writers go on."""
    async with (
        scratch_database(postgres_dsn(), "sessionhub_faults") as dsn,
        Node(dsn) as a,
        HubClient(a.ws_url) as on_a,
    ):
        sids = [(await on_a.sessions.create(f"chat {i}")).id for i in range(2)]
        ledger, stop = Ledger(), asyncio.Event()
        tasks = [
            asyncio.create_task(write_until(on_a, sid, f"w{i}", ledger, stop))
            for i, sid in enumerate(sids * 2)
        ]
        recoveries: list[float] = []
        terminated = 0
        admin = await asyncpg.connect(dsn)
        try:
            await asyncio.sleep(1.0)
            for _ in range(5):
                killed_at = time.monotonic()
                terminated += int(
                    await admin.fetchval(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                        "AND application_name NOT LIKE 'sessionhub-%'"  # the pool's, not the bus's
                    )
                )
                async with asyncio.timeout(20):
                    while not any(t > killed_at for t in ledger.ack_times("w")):
                        await asyncio.sleep(0.005)
                recoveries.append(min(t for t in ledger.ack_times("w") if t > killed_at) - killed_at)
                await asyncio.sleep(0.5)
        finally:
            await admin.close()
            stop.set()
            async with asyncio.timeout(30):
                await asyncio.gather(*tasks)
        report = await audit(dsn, sids, ledger)
    codes = sorted({e.code for e in ledger.refused().values()})
    show(
        "the writer node's Postgres connections terminated 5 times",
        {
            **vars(report),
            "backends terminated": terminated,
            "refused": len(ledger.refused()),
            "codes": "/".join(codes) or "-",
            "slowest answer s": max(a.took for a in ledger.answers.values()),
            "worst recovery s": max(recoveries),
        },
    )
    assert terminated >= 5
    assert (report.lost, report.gaps, report.duplicates, report.answered_but_stored) == (0, 0, 0, 0)
    assert report.acknowledged > 0
