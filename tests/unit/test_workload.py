"""Workload parsers: SWF conventions, the GPU-job CSV, and errors that name the line."""

from __future__ import annotations

import pytest

from corral.libs.sim.workload import SimJob, WorkloadError, parse_gpu_csv, parse_swf, parse_workload

pytestmark = pytest.mark.unit


def swf_line(
    job: int = 1, submit: int = 0, run: int = 10, alloc: int = 4, req_procs: int = 4, req_time: int = 20
) -> str:
    """One 18-column SWF record; the columns not used by the simulator are -1."""
    cols = [job, submit, -1, run, alloc, -1, -1, req_procs, req_time, -1, 1, 3, 3, -1, -1, -1, -1, -1]
    return "  ".join(str(c) for c in cols)


# (run, alloc, req_procs, req_time) -> (run_time, req_time, units)
SWF_CASES = {
    "plain": ((10, 4, 4, 20), (10, 20, 4)),
    "ran past its request: cut at it, request widened": ((30, 4, 4, 20), (20, 30, 4)),
    "no request: runs its run time, requests it": ((10, 4, 4, -1), (10, 10, 4)),
    "request 0 counts as none": ((10, 4, 4, 0), (10, 10, 4)),
    "zero run time runs 1 s": ((0, 4, 4, 20), (1, 20, 4)),
    "unknown run time and request: 1 s": ((-1, 4, 4, -1), (1, 1, 4)),
    "allocated processors win": ((10, 8, 4, 20), (10, 20, 8)),
    "no allocation: requested processors": ((10, -1, 6, 20), (10, 20, 6)),
    "zero allocation: requested processors": ((10, 0, 6, 20), (10, 20, 6)),
    "no processor count at all: 1": ((10, -1, -1, 20), (10, 20, 1)),
}


@pytest.mark.parametrize(("given", "expected"), SWF_CASES.values(), ids=SWF_CASES.keys())
def test_swf_conventions(given: tuple[int, int, int, int], expected: tuple[int, int, int]) -> None:
    run, alloc, req_procs, req_time = given
    [job] = parse_swf(swf_line(7, 100, run, alloc, req_procs, req_time))
    assert (job.run_time, job.req_time, job.units) == expected
    assert (job.id, job.submit, job.node_count) == (7, 100, expected[2])


def test_swf_skips_comments_and_blank_lines_and_sorts_by_submit() -> None:
    text = "; Version: 2.2\n;\n\n" + swf_line(2, 50) + "\n" + swf_line(1, 60) + "\n   ; late comment\n"
    text += swf_line(3, 50) + "\n"
    assert [(j.id, j.submit) for j in parse_swf(text)] == [(2, 50), (3, 50), (1, 60)]


SWF_ERRORS = {
    "too few fields": ("1 0 -1 10", "t.swf:3: 4 fields"),
    "not a number": (swf_line().replace(" 10 ", " ten ", 1), "t.swf:3: run_time: 'ten' is not a number"),
    "fractional seconds": (swf_line(submit=1).replace(" 1 ", " 1.5 ", 1), "is not a whole number"),
    "negative submit": (swf_line(submit=-5), "t.swf:3: submit: -5 is negative"),
    "job 0": (swf_line(job=0), "t.swf:3: job: 0 is not a positive job number"),
    "duplicate id": (swf_line(job=1), "t.swf:3: job id 1 already used on line 2"),
}


@pytest.mark.parametrize(("line", "message"), SWF_ERRORS.values(), ids=SWF_ERRORS.keys())
def test_swf_errors_name_the_line(line: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=r"^t\.swf:3: ") as err:
        parse_swf(f"; header\n{swf_line(job=1)}\n{line}\n", "t.swf")
    assert message in str(err.value)
    assert err.value.line == 3


CSV = """\
# a GPU workload
id,submit,duration,time_limit,nodes,gpus_per_node,gpu_type,user,partition
3,20,100,3600,2,8,h100,bob,train
1,10,7200,3600,1,4,,,
2,10,50,,1,0,,alice,cpu
"""


def test_gpu_csv_columns() -> None:
    jobs = parse_gpu_csv(CSV, "w.csv")
    assert jobs == [
        SimJob(1, 10, 3600, 3600, 4, nodes=1, gpus_per_node=4),
        SimJob(2, 10, 50, None, 1, nodes=1, user="alice", partition="cpu"),
        SimJob(
            3, 20, 100, 3600, 16, nodes=2, gpus_per_node=8, gpu_type="h100", user="bob", partition="train"
        ),
    ]


def test_gpu_csv_optional_columns_may_be_left_out_and_reordered() -> None:
    [job] = parse_gpu_csv("gpus_per_node,nodes,id,submit,time_limit,duration\n2,3,9,0,60,30\n")
    assert job == SimJob(9, 0, 30, 60, 6, nodes=3, gpus_per_node=2)


CSV_ERRORS = {
    "missing column": ("id,submit,duration,nodes,gpus_per_node\n", "w.csv:1: bad header: missing columns"),
    "unknown column": (
        "id,submit,duration,time_limit,nodes,gpus_per_node,gpus\n",
        "w.csv:1: bad header: unknown or repeated columns ['gpus']",
    ),
    "field count": ("id,submit,duration,time_limit,nodes,gpus_per_node\n1,0,10,10,1\n", "w.csv:2: 5 fields"),
    "bad number": ("id,submit,duration,time_limit,nodes,gpus_per_node\n1,0,x,10,1,1\n", "w.csv:2: duration"),
    "zero nodes": (
        "id,submit,duration,time_limit,nodes,gpus_per_node\n1,0,5,10,0,1\n",
        "nodes: 0 is below 1",
    ),
    "empty": ("# nothing\n", "w.csv:0: empty workload"),
}


@pytest.mark.parametrize(("text", "message"), CSV_ERRORS.values(), ids=CSV_ERRORS.keys())
def test_gpu_csv_errors_name_the_line(text: str, message: str) -> None:
    with pytest.raises(WorkloadError) as err:
        parse_gpu_csv(text, "w.csv")
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("source", "text", "kind"),
    [
        ("t.swf", swf_line(), "swf"),
        ("t.csv", "id,submit,duration,time_limit,nodes,gpus_per_node\n1,0,5,10,1,1\n", "csv"),
        ("trace", "; c\n" + swf_line(), "swf"),
        ("trace", "id,submit,duration,time_limit,nodes,gpus_per_node\n1,0,5,10,1,1\n", "csv"),
    ],
    ids=["swf by name", "csv by name", "swf by content", "csv by content"],
)
def test_parse_workload_tells_the_formats_apart(source: str, text: str, kind: str) -> None:
    [job] = parse_workload(text, source)
    assert job.gpus_per_node == (1 if kind == "csv" else 0)
