"""The synchronous client: a thin blocking facade over one AsyncClient.

The AsyncClient runs on a private event loop in a daemon thread, so pipelining,
retries and error mapping exist once. Each method submits a coroutine with
`asyncio.run_coroutine_threadsafe` and waits for it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncGenerator, Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .async_client import DEFAULT_TARGET, AsyncClient
from .results import DeployResult, PushResult, Result, StatementPlan

_T = TypeVar("_T")


class Client:
    """Blocking streamtx client; `with Client(...) as c:` closes it on exit.

    Takes the same arguments as AsyncClient. Safe to use from several threads:
    all work is serialised onto the client's own event loop.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        producer_id: str | None = None,
        max_in_flight: int = 256,
        arrow: bool = True,
        retries: int = 5,
        timeout: float | None = None,
        tls_ca: str | bytes | Path | None = None,
        tls_cert: str | bytes | Path | None = None,
        tls_key: str | bytes | Path | None = None,
    ) -> None:
        kwargs = {
            "tls_ca": tls_ca,
            "tls_cert": tls_cert,
            "tls_key": tls_key,
            "token": token,
            "producer_id": producer_id,
            "max_in_flight": max_in_flight,
            "arrow": arrow,
            "retries": retries,
            "timeout": timeout,
        }
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=f"streamtx-client-{target}", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._async = self._run(self._create(target, kwargs))
        except BaseException:
            self._stop_loop()
            raise

    @staticmethod
    async def _create(target: str, kwargs: dict[str, Any]) -> AsyncClient:
        return AsyncClient(target, **kwargs)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Runs a coroutine on the client's loop and blocks for its result."""
        if self._loop.is_closed() or not self._thread.is_alive():
            coro.close()
            from streamtx.errors import FailedPrecondition

            raise FailedPrecondition("client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    # -- attributes of the underlying client ------------------------------------

    @property
    def target(self) -> str:
        return self._async.target

    @property
    def producer_id(self) -> str:
        return self._async.producer_id

    @property
    def in_flight(self) -> int:
        return self._async.in_flight

    # -- lifecycle ---------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.close(flush=exc_type is None)

    def close(self, flush: bool = True) -> None:
        """Flushes (by default), closes the connection and stops the loop thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._async.close(flush=flush))
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
        if not self._thread.is_alive() and not self._loop.is_closed():
            self._loop.close()

    # -- calls ---------------------------------------------------------------------

    def deploy(self, sql: str) -> DeployResult:
        """Deploys a script atomically; see AsyncClient.deploy."""
        return self._run(self._async.deploy(sql))

    def explain(self, name: str) -> list[StatementPlan]:
        """How each SQL statement of a procedure or EE trigger runs; see AsyncClient.explain."""
        return self._run(self._async.explain(name))

    def call(self, procedure: str, **params: Any) -> list[Result]:
        """Runs an OLTP procedure; one Result per result-producing statement."""
        return self._run(self._async.call(procedure, **params))

    def query(self, sql: str, params: Mapping[str, Any] | None = None) -> Result:
        """Read-only SQL over the committed state."""
        return self._run(self._async.query(sql, params))

    def checkpoint(self) -> dict[str, Any]:
        """Admin: an online checkpoint of every partition; see AsyncClient.checkpoint."""
        return self._run(self._async.checkpoint())

    def rebalance(
        self,
        moves: Sequence[tuple[int, int, int]] = (),
        *,
        even: bool = False,
        strategy: str | None = None,
        bins_per_step: int | None = None,
        resume: bool = False,
        partitions: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Admin: moves bins between partitions, or grows or shrinks the server to `partitions`, while it
        runs; see AsyncClient.rebalance."""
        return self._iterate(
            self._async.rebalance(
                moves, even=even, strategy=strategy, bins_per_step=bins_per_step, resume=resume, partitions=partitions
            )
        )

    def status(self) -> dict[str, Any]:
        """Server status as a plain dict."""
        return self._run(self._async.status())

    def push_one(self, stream: str, rows: Any, *, batch_id: int | None = None) -> PushResult:
        """One batch over a unary call (a round trip each); see AsyncClient.push_one."""
        return self._run(self._async.push_one(stream, rows, batch_id=batch_id))

    def push(self, stream: str, rows: Any, *, batch_id: int | None = None) -> concurrent.futures.Future[PushResult]:
        """Pipelines one batch; blocks only while `max_in_flight` batches are unacknowledged.

        The returned future resolves with the batch's PushResult when its ack arrives.
        """
        return self._run(self._push(stream, rows, batch_id))

    async def _push(self, stream: str, rows: Any, batch_id: int | None) -> concurrent.futures.Future[PushResult]:
        afut = await self._async.push(stream, rows, batch_id=batch_id)
        cfut: concurrent.futures.Future[PushResult] = concurrent.futures.Future()

        def relay(f: asyncio.Future[PushResult]) -> None:
            if f.cancelled():
                cfut.cancel()
            elif f.exception() is not None:
                cfut.set_exception(f.exception())  # type: ignore[arg-type]
            else:
                cfut.set_result(f.result())

        afut.add_done_callback(relay)
        return cfut

    def flush(self) -> list[PushResult]:
        """Waits for every in-flight batch; returns their results in send order."""
        return self._run(self._async.flush())

    def subscribe(self, stream: str, from_ts: int = 0) -> Iterator[tuple[int, Result]]:
        """Iterates (ts, Result) over a stream's committed batches, from timestamp `from_ts` on."""
        return self._iterate(self._async.subscribe(stream, from_ts))

    def _iterate(self, agen: AsyncGenerator[_T, None]) -> Iterator[_T]:
        """An async iterator of the client's loop, iterated from this thread; closed when left early."""
        try:
            while True:
                try:
                    item = self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if not self._loop.is_closed() and self._thread.is_alive():
                asyncio.run_coroutine_threadsafe(agen.aclose(), self._loop).result(timeout=5)


def connect(target: str = DEFAULT_TARGET, **kwargs: Any) -> Client:
    """A synchronous Client for `target` (same keyword arguments as AsyncClient)."""
    return Client(target, **kwargs)
