"""`specq bench` on a toy model: the report's figures are consistent with each other."""

from __future__ import annotations

import json

from click.testing import CliRunner

from specq.cli import main


def test_bench_reports_every_config_and_category(toy_model_path, tmp_path):
    prompts = tmp_path / "p.jsonl"
    lines = [
        {"custom_id": f"{cat}-{i}", "category": cat, "prompt": f"the cat {cat} {i} the cat", "max_tokens": 24}
        for cat in ("qa", "code") for i in range(3)
    ]
    prompts.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    result = CliRunner().invoke(
        main,
        ["bench", "--input", str(prompts), "--model", toy_model_path, "--proposers", "ngram", "--k", "2,4",
         "--repeat", "2", "--limit", "2", "--json", "--plot", str(tmp_path / "charts")],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {(r["config"], r["category"]): r for r in report["results"]}
    assert set(rows) == {(c, cat) for c in ("none", "ngram k=2", "ngram k=4") for cat in ("code", "qa", "all")}
    for (config, category), r in rows.items():
        assert r["requests"] == (4 if category == "all" else 2)  # --limit 2 per category
        if config == "none":
            assert r["speedup"] == 1.0 and r["tau"] == 1.0 and r["exact"] is None
        else:
            assert r["exact"] is True  # greedy speculative output equals plain output
            assert r["tau"] >= 1.0 and len(r["accepted_per_position"]) <= int(config[-1])
    assert set(report["verify_cost"]) == {"3", "5"}
    assert "tok/s" in result.stderr and "verify cost" in result.stderr
    charts = sorted(p.name for p in (tmp_path / "charts").iterdir())
    assert charts == ["acceptance_per_position.png", "speedup_per_category.png", "tokens_per_s_vs_k.png"]
    for name in charts:
        data = (tmp_path / "charts" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000  # a real image, not an empty canvas


def test_bench_refuses_unknown_proposers_and_bad_lists(toy_model_path):
    runner = CliRunner()
    bad = runner.invoke(main, ["bench", "--model", toy_model_path, "--proposers", "magic"])
    assert bad.exit_code == 2 and "unknown proposer 'magic'" in bad.stderr
    bad = runner.invoke(main, ["bench", "--model", toy_model_path, "--k", "0,2"])
    assert bad.exit_code == 2 and "integers >= 1" in bad.stderr
