"""The scheduler's window timer: it fires once its deadline has passed, never before, and not at
all once disarmed (how close to the deadline is bench/serving.py's to show, not a test's)."""

from __future__ import annotations

import asyncio

from service.core.precise_timer import PreciseTimer


def test_it_fires_after_its_deadline_and_not_once_disarmed() -> None:
    async def main():
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        timer = PreciseTimer(loop, lambda: fired.append(loop.time()))
        try:
            deadline = loop.time() + 0.05
            timer.arm(deadline)
            while not fired:
                await asyncio.sleep(0.01)
            assert fired[0] >= deadline
            timer.arm(loop.time() + 0.05)
            timer.disarm()
            await asyncio.sleep(0.2)
            assert len(fired) == 1
            timer.arm(loop.time() - 1)  # a deadline already past fires at once
            await asyncio.sleep(0.05)
            assert len(fired) == 2
        finally:
            timer.close()
    asyncio.run(main())
