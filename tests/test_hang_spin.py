"""hang/spin.py: why a busy loop does not end, from its source and two reads of its locals (pure). The
real-job versions (py-spy --locals on a spinning gloo rank) are in tests/test_hang_waits.py
(float_loop, stuck_loop, worker_stuck)."""

from __future__ import annotations

from ddpdoctor.hang.spin import LocalsRead, spin_mechanism, the_loop

FLOAT = """def build(w):
    acc = 0.0
    while acc != w:
        acc += 0.1
    return acc
""".splitlines()

SKIP = """def clean(items):
    i = 0
    while i < len(items):
        if items[i] is None:
            continue
        i += 1
""".splitlines()

BISECT = """def cut(lo, hi, fits):
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo
""".splitlines()

STEP = """def align(n):
    while n != 100:
        n += 3
""".splitlines()

FOREVER = """def wait_for(flag):
    while True:
        if flag.ready:
            break
        spin = 1
""".splitlines()


def test_float_equality_from_the_locals_and_from_the_source_alone():
    reads = [LocalsRead(4, {"acc": "0.30000000000000004", "w": "0.3"}), LocalsRead(4, {"acc": "9000.2", "w": "0.3"})]
    found = spin_mechanism(FLOAT, 4, reads, 0.5)
    assert found is not None and found["id"] == "loop.float_equality"
    assert "(now acc = 9000.2, w = 0.3)" in str(found["summary"]) and "`while acc < w`" in str(found["fix"])
    # Without locals (py-spy could not read them) the `+= 0.1` in the body says it.
    bare = spin_mechanism(FLOAT, 3)
    assert bare is not None and bare["id"] == "loop.float_equality" and "(now" not in str(bare["summary"])


def test_no_progress_names_the_continue_that_skips_the_increment():
    reads = [LocalsRead(4, {"i": "1", "items": "[1, None, 2]"}), LocalsRead(5, {"i": "1", "items": "[1, None, 2]"})]
    found = spin_mechanism(SKIP, 4, reads, 0.5)
    assert found is not None and found["id"] == "loop.no_progress"
    summary = str(found["summary"])
    assert "did not change between two reads 0.5 s apart (i = 1, items = [1, None, 2])" in summary
    assert "the `continue` at line 5 goes back to the header before line 6 (`i += 1`) runs" in summary


def test_no_progress_in_a_bisection_names_the_assignment():
    reads = [LocalsRead(3, {"lo": "4", "hi": "5"}), LocalsRead(5, {"lo": "4", "hi": "5"})]
    found = spin_mechanism(BISECT, 5, reads, 0.5)
    assert found is not None and found["id"] == "loop.no_progress"
    assert "line 5 (`lo = mid`)" in str(found["summary"]) and "lo = mid + 1" in str(found["fix"])


def test_values_that_moved_are_no_lack_of_progress():
    reads = [LocalsRead(4, {"lo": "4", "hi": "90"}), LocalsRead(4, {"lo": "40", "hi": "90"})]
    assert spin_mechanism(BISECT, 4, reads, 0.5) is None


def test_an_exact_exit_value_stepped_past():
    reads = [LocalsRead(3, {"n": "1000"}), LocalsRead(3, {"n": "90001"})]
    found = spin_mechanism(STEP, 3, reads, 0.5)
    assert found is not None and found["id"] == "loop.stepped_past_exit"
    assert "n: 1000 -> 90001" in str(found["summary"])
    # Coming closer is not stepping past.
    assert spin_mechanism(STEP, 3, [LocalsRead(3, {"n": "10"}), LocalsRead(3, {"n": "40"})], 0.5) is None


def test_while_true_lists_its_exits():
    found = spin_mechanism(FOREVER, 5, [LocalsRead(5, {"spin": "1"})])
    assert found is not None and found["id"] == "loop.exit_never_taken"
    assert "line 4 (`break` under `if flag.ready:`)" in str(found["summary"])


def test_reads_from_outside_the_loop_and_lines_outside_any_loop():
    # Reads whose line is outside the loop are not of this loop: no claim about progress.
    outside = [LocalsRead(1, {"i": "1"}), LocalsRead(1, {"i": "1"})]
    assert spin_mechanism(SKIP, 4, outside, 0.5) is None
    assert spin_mechanism(SKIP, 2) is None  # `i = 0` is in no loop
    assert spin_mechanism(SKIP, 99) is None
    assert the_loop(SKIP, 3) is not None and the_loop(SKIP, 3).header == 3  # the header itself


def test_garbage_headers_are_no_crash():
    weird = ["def f():", "    while (a !=:", "        a += 0.5", "    while " + "(" * 500 + ":", "        pass"]
    assert spin_mechanism(weird, 3) is None
    assert spin_mechanism(weird, 5) is None


PACK = """def pack(pending, rows):
    while pending:
        doc = pending[0]
        placed = False
        for row in rows:
            if len(row) + len(doc) <= 8:
                row.extend(doc)
                pending.pop(0)
                placed = True
                break
        if not placed and any(rows):
            break
""".splitlines()


def test_a_for_loop_inside_the_while_that_does_not_end():
    # Held-out hang set 6 (j17): the busy line is in `for row in rows:`, which ends; `while pending:` does not.
    reads = [LocalsRead(6, {"pending": "[[1, 2, 3]]", "rows": "[[]]"}), LocalsRead(7, {"pending": "[[1, 2, 3]]"})]
    found = spin_mechanism(PACK, 6, reads, 0.5)
    assert found is not None and found["id"] == "loop.no_progress"
    assert "`while pending:` (line 2)" in str(found["summary"])
    assert "changes it only at line 8 (`pending.pop(0)`)" in str(found["summary"])


DOUBLING = """def bucket_edges(lengths):
    top = lengths.max()
    edge = max(lengths.min(), 64)
    while edge < top:
        edge = edge * 2
    return edge
""".splitlines()


def test_a_doubling_stuck_at_zero_is_an_overflow():
    # Held-out hang set 10, j12: an int16 edge doubled past 16384 wrapped to -32768, then to 0.
    reads = [LocalsRead(4, {"edge": "0", "top": "30000"}), LocalsRead(5, {"edge": "0", "top": "30000"})]
    found = spin_mechanism(DOUBLING, 5, reads, 0.5)
    assert found is not None and found["id"] == "loop.no_progress"
    assert "a product that is now edge = 0" in str(found["summary"]) and "wraps round" in str(found["summary"])
    # A doubling still at a positive value that did not move is no overflow: the plain reason stays.
    still = [LocalsRead(4, {"edge": "64", "top": "30000"}), LocalsRead(5, {"edge": "64", "top": "30000"})]
    plain = spin_mechanism(DOUBLING, 5, still, 0.5)
    assert plain is not None and "wraps round" not in str(plain["summary"])
    assert "which gives it the same value again" in str(plain["summary"])


HELPER = """def wrap16(value):
    return ((value + 32768) & 0xFFFF) - 32768


def bucket_edges(top):
    edge = 64
    while edge < top:
        edge = wrap16(edge * 2)
    return edge
""".splitlines()


def test_a_loop_caught_inside_the_helper_it_calls_is_read_at_the_caller():
    # A spinning rank caught in wrap16() (no loop there) most of the time: the loop, its condition and its
    # locals are bucket_edges()'s (seen in CI with an early version of the doubling job).
    from ddpdoctor.hang.findings import HangFacts
    from ddpdoctor.hang.fr import Frame
    from ddpdoctor.hang.spin import loop_reason, looping_frame
    from ddpdoctor.hang.stacks import RankStack, ThreadStack

    helper, caller = Frame("/job/edges.py", 2, "wrap16"), Frame("/job/edges.py", 8, "bucket_edges")
    chain = (helper, caller, Frame("/job/train.py", 30, "main"))
    sources = {"/job/edges.py": HELPER, "/job/train.py": ["pass"] * 40}
    assert looping_frame(chain, sources) == caller
    assert looping_frame(chain[:1], sources) is None
    facts = HangFacts(host="h", stacks=[RankStack(1, 42, [ThreadStack("MainThread", chain)])], sources=sources,
                      loop_locals={42: [(8, {"edge": "0", "top": "30000"}), (7, {"edge": "0", "top": "30000"})]},
                      loop_gap_s=0.5)
    found = loop_reason(facts, 42, helper)
    assert found is not None and found["id"] == "loop.no_progress", found
    assert "`while edge < top:` (line 7)" in str(found["summary"]) and "edge = 0" in str(found["summary"])
