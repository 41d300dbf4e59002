"""Unit checks of bench/lib/spillbench (standard library only; no benchmark is run):

    python3 -m unittest discover -s bench/lib
"""

import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from spillbench import analysis, http, loadgen, markdown, mockmodel, stats  # noqa: E402

SSE = b"".join(b'data: {"choices":[{"delta":{"content":"w%d"}}]}\n\n' % i for i in range(4))
SSE += b"data: [DONE]\n\n"


def chunked(body, size):
    return b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
                    for i in range(0, len(body), size)) + b"0\r\n\r\n"


class FakeEngine:
    """An HTTP/1.1 server on a thread: every third request 529, the others a chunked SSE
    stream of four content events."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.n = 0
        ready = threading.Event()
        threading.Thread(target=self.run, args=(ready,), daemon=True).start()
        ready.wait()

    def run(self, ready):
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self.serve, "127.0.0.1", 0))
        self.port = self.server.sockets[0].getsockname()[1]
        ready.set()
        self.loop.run_forever()

    async def serve(self, reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(http.content_length(head))
        self.n += 1
        if self.n % 3 == 0:
            writer.write(b"HTTP/1.1 529 Site Overloaded\r\ncontent-length: 0\r\n\r\n")
        else:
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in (chunked(SSE, 50)[i:i + 40] for i in range(0, len(chunked(SSE, 50)), 40)):
                writer.write(part)
                await writer.drain()
        await writer.drain()
        writer.close()

    def stop(self):
        self.loop.call_soon_threadsafe(self.loop.stop)


class StreamTest(unittest.TestCase):
    def test_dechunks_and_counts_at_any_split(self):
        data = chunked(SSE, 37)
        for step in (1, 2, 7, len(data)):
            s = http.Stream(True)
            firsts = 0
            for i in range(0, len(data), step):
                if s.ended:
                    break
                firsts += s.feed(data[i:i + step])
            self.assertEqual((s.tokens, s.done, s.ended, firsts), (4, True, True, 1))

    def test_plain_body(self):
        s = http.Stream(False)
        s.feed(SSE)
        self.assertEqual((s.tokens, s.done), (4, True))


class StatsTest(unittest.TestCase):
    def test_nearest_rank(self):
        v = list(range(1, 101))
        self.assertEqual((stats.pct(v, 50), stats.pct(v, 99), stats.pct(v, 100)), (50, 99, 100))
        self.assertIsNone(stats.pct([], 50))

    def test_median_skips_none(self):
        self.assertEqual(stats.median([3, None, 1, 2]), 2)
        self.assertIsNone(stats.median([None]))

    def test_slope(self):
        self.assertAlmostEqual(stats.slope([0, 1, 2, 3], [1, 3, 5, 7]), 2.0)


class MarkdownTest(unittest.TestCase):
    COMMITTED = "# r\n\n| a | b |\n|---|---|\n| 1 | 2.0 |\n\nnote\n\n| x |\n|---|\n| hand |\n"

    def test_same_table_passes(self):
        ok, notes = markdown.compare(self.COMMITTED, "| a | b |\n|---|---|\n| 1 | 2.0 |\n", "r")
        self.assertTrue(ok, notes)

    def test_other_cell_fails(self):
        ok, notes = markdown.compare(self.COMMITTED, "| a | b |\n|---|---|\n| 1 | 2.1 |\n", "r")
        self.assertFalse(ok)
        self.assertIn("+| 1 | 2.1 |", "\n".join(notes))

    def test_unknown_cell_matches_any(self):
        ok, notes = markdown.compare(
            self.COMMITTED, f"| a | b |\n|---|---|\n| 1 | {markdown.UNKNOWN} |\n", "r")
        self.assertTrue(ok, notes)
        self.assertIn("1 cells", notes[0])

    def test_formats(self):
        self.assertEqual((markdown.ms(0.0345), markdown.ms(0.1234), markdown.ms(2.0, True)),
                         ("34.5", "123", "≥ 2000"))
        self.assertEqual((markdown.fmt_us(0.00083), markdown.fmt_us(0.00123)), ("830", "1.23 ms"))


class ModelTest(unittest.TestCase):
    def test_overload_capacity(self):
        a = type("A", (), dict(prompt_bytes=1024, max_tokens=64, max_num_seqs=64, kv_blocks=2048,
                               block_size=16, prefill_tps=20000, step_ms=8, step_per_seq_ms=0.25))
        c, b, step = mockmodel.model_capacity(a)
        self.assertEqual(b, 64)
        self.assertAlmostEqual(step, 0.0368)
        self.assertEqual(f"{2 * c:.1f}", "54.3")  # results/overload.md's C for two engines


class LoadgenTest(unittest.TestCase):
    def test_arrivals_are_the_seeds(self):
        a = list(loadgen.arrivals(random.Random(7), 50, 2))
        self.assertEqual(a, list(loadgen.arrivals(random.Random(7), 50, 2)))
        self.assertTrue(all(0 < x < 2 for x in a) and a == sorted(a))
        self.assertEqual(list(loadgen.arrivals(random.Random(1), 8, 0.5, "constant")),
                         [0.125, 0.25, 0.375])

    def test_open_loop_against_a_fake_engine(self):
        engine = FakeEngine()
        try:
            with tempfile.TemporaryDirectory() as d:
                out = os.path.join(d, "run.jsonl")
                env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
                subprocess.run([sys.executable, "-m", "spillbench.loadgen", "--ports",
                                str(engine.port), "--model", "m", "--rate", "40", "--duration",
                                "0.5", "--drain", "2", "--max-tokens", "4", "--seed", "3",
                                "--out", out], env=env, check=True, capture_output=True)
                with open(out) as f:
                    meta = json.loads(f.readline())
                meta, recs = analysis.load_run(out)
        finally:
            engine.stop()
        self.assertTrue(meta["meta"])
        self.assertEqual(len(recs), meta["requests"])
        outcomes = [r["outcome"] for r in recs]
        self.assertEqual(set(outcomes), {"ok", "rejected"}, recs)
        self.assertTrue(all(r["tokens"] == 4 and r["ttft"] > 0 for r in recs if r["outcome"] == "ok"))
        s = analysis.analyse(meta, recs, 0.0, 0.5, 4)
        self.assertEqual(s["arrivals"], len(recs))
        self.assertEqual(s["rejected"], outcomes.count("rejected"))
        self.assertEqual(s["errors"], 0)

    def test_a_request_past_its_timeout_is_given_up(self):
        async def silent(reader, writer):
            await reader.read()  # reads until the client closes; never answers

        async def run():
            server = await asyncio.start_server(silent, "127.0.0.1", 0)
            port = server.sockets[0].getsockname()[1]
            loop = asyncio.get_running_loop()
            rec = {"sched": 0.0}
            await loadgen.fetch("127.0.0.1", port, http.BENCH_REQUEST, 0.0, loop.time(), rec, 4,
                                timeout=0.2)
            server.close()
            return rec

        rec = asyncio.run(run())
        self.assertEqual((rec["outcome"], rec["why"]), ("timeout", "timeout"))
        self.assertTrue(0.2 <= rec["end"] < 1.0, rec)
        self.assertNotIn("status", rec)


if __name__ == "__main__":
    unittest.main()
