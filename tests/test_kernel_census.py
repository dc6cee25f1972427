"""The host-against-device benchmarks: kernel_census's forwards leave the caches as they found them
and its reader splits an Nsight Compute CSV at the marker kernels (the device runs cannot happen
here); cycle_profile and cycle_cost time the verify in other layer groups."""

import json
import os

import mlx.core as mx
import pytest

from dflash_tui.bench import kernel_census as kc

HEADER = '"ID","Process ID","Kernel Name","gpu__time_duration.sum"'


def _csv(rows: list[tuple[str, str]], unit: str = "ns") -> str:
    lines = ["==PROF== Connected to process 1", HEADER, f'"","","","{unit}"']
    lines += [f'"{i}","1","{name}","{t}"' for i, (name, t) in enumerate(rows)]
    return "\n".join(lines) + "\n==PROF== Disconnected from process 1\n"


def _marker(phase: str) -> str:
    return f"mlx::custom_kernel_{kc.MARK}{kc.slug(phase)}(const float *, float *)"


def _lengths(state) -> list:
    return [c.offset if hasattr(c, "trim") else [a.tolist() for a in c.cache if a is not None]
            for c in state.target_cache]


@pytest.mark.parametrize("shape", ["tiny", "tiny-hybrid"])
def test_every_forward_puts_the_caches_back(shape):
    state, token = kc.prepare(shape, 12)
    forwards = kc.phases(state, token, 4)
    assert [name for name, _, _ in forwards] == ["mlx-lm step", "engine verify 4", "engine verify 4 step rows", "draft 4"]
    before = _lengths(state)
    for name, run, reset in forwards:
        out = run()
        mx.eval(out)
        assert _lengths(state) != before or name.startswith("draft"), name  # the forward did write the caches
        reset()
        assert _lengths(state) == before, name


def test_run_census_runs_each_forward_on_the_cpu_without_markers(capsys):
    assert kc.main(["--shape", "tiny", "--context", "10", "--block-size", "3"]) == 0
    info = json.loads(capsys.readouterr().err)
    assert info["phases"] == ["mlx-lm step", "engine verify 3", "engine verify 3 step rows", "draft 3"]
    assert info["markers"] is False


def test_reader_splits_the_kernels_at_each_marker_and_sums_their_time():
    text = _csv([("void mlx::copy_s<float>(const float *)", "4,000"),  # before the first marker: left out
                 (_marker("mlx-lm step"), "1000"),
                 ("void mlx::gemv_single<__nv_bfloat16, 8, 4>(const T1 *, int)", "3,000"),
                 ("void mlx::gemv_single<__nv_bfloat16, 8, 4>(const T1 *, int)", "2000"),
                 ("void mlx::rms_norm_small<__nv_bfloat16, 64>(const T1 *)", "500"),
                 (_marker("engine verify 16"), "900"),
                 ("nvjet_sm90_tst_128x16_64x11_4x1_v_bz_TNT", "6000"),
                 (_marker("draft 16"), "900"),
                 ("nvjet_sm90_tst_384x16", "1500")])
    found = kc.read_census(text)
    assert [p.name for p in found] == ["mlx_lm_step", "engine_verify_16", "draft_16"]
    step = found[0]
    assert (step.kernels, step.device_ms) == (3, pytest.approx(0.0055))
    assert step.launches["mlx::gemv_single<__nv_bfloat16, 8, 4>"] == 2
    row = step.row(top=1)
    assert row["top"] == [{"kernel": "mlx::gemv_single<__nv_bfloat16, 8, 4>", "ms": pytest.approx(0.005), "launches": 2}]
    assert kc.device_price(found, 16) == pytest.approx((6.0 + 1.5) / 5.5)
    assert kc.device_price(found[:2], 16) is None  # no draft: no price


def test_reader_takes_the_csv_unit_and_refuses_what_is_not_a_census(tmp_path, capsys):
    us = kc.read_census(_csv([(_marker("draft 4"), "1"), ("k(int)", "2.5")], unit="usecond"))
    assert us[0].device_ms == pytest.approx(0.0025)
    with pytest.raises(ValueError, match="unknown time unit"):
        kc.read_census(_csv([(_marker("draft 4"), "1")], unit="furlong"))
    with pytest.raises(ValueError, match="no marker kernels"):
        kc.read_census(_csv([("k(int)", "2")]))
    with pytest.raises(ValueError, match="no Nsight Compute CSV"):
        kc.read_census("==PROF== nothing profiled\n")
    good = tmp_path / "census.csv"
    good.write_text(_csv([(_marker("mlx-lm step"), "1"), ("k(int)", "2000")]))
    assert kc.main(["--read", str(good)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["phases"][0]["kernels"] == 1 and printed["device_price"] is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    for bad in (tmp_path / "missing.csv", tmp_path, fifo):  # missing, a directory, a FIFO: one line, exit 1
        assert kc.main(["--read", str(bad)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("kernel_census: ") and err.count("\n") == 1


def test_cycle_profile_times_the_verify_in_six_groups(monkeypatch):
    from dflash_tui.bench import cycle_profile
    from dflash_tui.engine import target as target_mod

    monkeypatch.setattr(target_mod, "default_flush_every", lambda n: 2)  # as on a GPU: two groups
    rows = {r["variant"]: r for r in cycle_profile.profile("tiny", 12, 4, 1, mx.bfloat16)}
    assert "error" not in rows["engine verify 4 six groups"], rows["engine verify 4 six groups"]
    assert 0 < rows["engine verify 4 six groups"]["build_ms"] <= rows["engine verify 4 six groups"]["total_ms"]


def test_cycle_cost_flush_setups_regroup_the_forwards_and_decode_the_same_tokens(monkeypatch):
    from dflash_tui.bench import cycle_cost
    from dflash_tui.engine import target as target_mod
    from dflash_tui.engine.speculative import dflash_cycles, draft_proposals
    from dflash_tui.engine.state import DecodeState

    monkeypatch.setattr(target_mod, "default_flush_every", lambda n: -(-n // 2))  # two groups, as on a GPU
    target, draft = cycle_cost.build("tiny-hybrid", 2, mx.float32)  # 8 layers: groups of 4, 2 and none
    prompt = cycle_cost.random_prompt(target.vocab_size, 14)
    launched: list[int] = []
    monkeypatch.setattr(target_mod.mx, "async_eval", lambda *a: launched.append(1) or mx.eval(*a))

    def tokens() -> list[int]:
        state = DecodeState(target, draft)
        logits, _ = state.prefill(prompt)
        out: list[int] = []
        for cyc in dflash_cycles(state, int(logits.argmax().item()), 4, lambda: 16 - len(out), propose=draft_proposals):
            out += list(cyc.emitted)
        return out

    runs, launches = {}, {}
    for name, every in (("engine", 4), ("no-flush", 0), ("six-groups", 2), ("engine", 4)):
        setup = cycle_cost.apply_setup(target, draft, name, {"DFLASH_TUI_KERNELS": ""})
        assert setup["flush_every"] == target.flush_every == every and setup["setup"] == name
        del launched[:]
        runs[name] = tokens()
        launches[name] = len(launched)
    # mid-forward launches: one a forward in two groups, three in six groups (of 2 layers), none whole
    assert launches["six-groups"] > launches["engine"] > launches["no-flush"] == 0, launches
    assert runs["no-flush"] == runs["six-groups"] == runs["engine"] and len(runs["engine"]) >= 16
