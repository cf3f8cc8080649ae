"""BERTScore encoder and layer as settings, and the MCQ option labelling of DERA-QA tables."""

from __future__ import annotations

import pytest

from experiments.common.text import bertscore_config, bertscore_f1, known_layer
from experiments.core.record import record


def test_default_layers_come_from_bert_score_own_table():
    from bert_score.utils import model2layers

    assert known_layer("roberta-large") == (17, "roberta-large") == (model2layers["roberta-large"], "roberta-large")
    # the DERA paper's encoder, however the local folder spells it
    for name in ("scibert-basevocab-uncased", "scibert_basevocab_uncased", "/weights/scibert-basevocab-uncased"):
        assert known_layer(name) == (9, "nfliu/scibert_basevocab_uncased")
    assert known_layer("all-MiniLM-L6-v2") is None and known_layer("model") is None


def test_local_encoder_dir_named_like_a_known_model_gets_its_layer(tmp_path):
    enc = tmp_path / "roberta-large"
    enc.mkdir()
    (enc / "config.json").write_text('{"num_hidden_layers": 24}')
    cfg = bertscore_config(str(enc))
    assert (cfg["encoder"], cfg["layer"], cfg["num_hidden_layers"]) == ("roberta-large", 17, 24)
    assert "model2layers['roberta-large']" in cfg["layer_source"]
    assert bertscore_config(str(enc), 20)["layer"] == 20 and bertscore_config(str(enc), 20)["layer_source"] == "set explicitly"
    other = tmp_path / "my-encoder"
    other.mkdir()
    (other / "config.json").write_text('{"num_hidden_layers": 12}')
    assert bertscore_config(str(other))["layer"] == 12  # unknown to bert_score: the last layer


def test_embedded_default_is_the_local_minilm_at_its_last_layer():
    cfg = bertscore_config()
    assert cfg["encoder"].startswith("all-MiniLM-L6-v2") and "local default" in cfg["encoder"]
    assert cfg["layer"] == 6 and cfg["num_hidden_layers"] == 6
    # the layer changes the score; the default equals asking for layer 6 explicitly
    a = bertscore_f1(["the patient has a cough"], ["she reports coughing"])
    b = bertscore_f1(["the patient has a cough"], ["she reports coughing"], num_layers=6)
    c = bertscore_f1(["the patient has a cough"], ["she reports coughing"], num_layers=3)
    assert a == pytest.approx(b) and a != pytest.approx(c)


def test_meditod_nlg_metrics_name_encoder_and_layer():
    from experiments.studies.meditod.metrics import gold_length_report, score

    m = score("nlg", ["Do you have a fever?"], ["Any fever?"])
    assert m["bertscore_encoder"].startswith("all-MiniLM-L6-v2") and m["bertscore_layer"] == 6
    m3 = score("nlg", ["Do you have a fever?"], ["Any fever?"], bertscore_layer=3)
    assert m3["bertscore_layer"] == 3 and m3["bertscore_f1"] != pytest.approx(m["bertscore_f1"])
    words = lambda s: len(s.split())  # noqa: E731 - a stand-in tokenizer
    r = gold_length_report(["a b c", "a " * 10, "a"], 5, words)
    assert (r["max_tokens"], r["golds"], r["golds_over_cap"], r["gold_tokens_max"], r["gold_tokens_median"]) == (5, 3, 1, 10, 3)
    m = score("nlg", ["a b c", "a " * 10], ["a", "a"], bertscore=False, max_tokens=5, count_tokens=words)
    assert m["gold_length"]["golds_over_cap"] == 1 and "bertscore_f1" not in m


def test_meditod_bertscore_encoder_is_its_own_setting(monkeypatch):
    """The retrieval `encoder` never reaches BERTScore; `bertscore_encoder` / `bertscore_layer` do."""
    from experiments.studies.meditod import metrics as M
    from experiments.studies.meditod import study as run_mod

    seen = {}
    monkeypatch.setattr(M, "score", lambda task, golds, preds, **kw: seen.update(kw) or {})
    s = run_mod.MeditodSettings(task="nlg", encoder="/retrieval/enc", bertscore_encoder="/bs/roberta-large", bertscore_layer=17)
    run_mod.score_records(s, [record("1/1", "1", target="a", answer="a")])
    assert seen["bertscore_encoder"] == "/bs/roberta-large" and seen["bertscore_layer"] == 17 and "encoder" not in seen
    assert run_mod.MeditodSettings().bertscore_encoder is None  # the local MiniLM default
    for mode in ("icl", "supervised"):
        cfg = (run_mod.CONFIGS / f"nlg_{mode}.yaml").read_text()
        assert "bertscore_encoder: null" in cfg and "roberta-large, layer 17" in cfg


def test_meditod_table_names_encoder_and_layer_and_warns_on_mixed_columns():
    from experiments.studies.meditod.study import metrics_table

    mini = {"bleu2": 10.0, "bertscore_f1": 0.9, "bertscore_encoder": "all-MiniLM-L6-v2", "bertscore_layer": 6}
    table = metrics_table("nlg", [("icl", mini), ("supervised", dict(mini, bertscore_f1=0.8))])
    assert "| BERTScore F1 (all-MiniLM-L6-v2, layer 6) | 0.9000 | 0.8000 |" in table and "not comparable" not in table
    table = metrics_table("nlg", [("icl", mini), ("supervised", dict(mini, bertscore_encoder="roberta-large", bertscore_layer=17))])
    assert "not comparable" in table and "icl: all-MiniLM-L6-v2, layer 6; supervised: roberta-large, layer 17" in table
    old = {k: v for k, v in mini.items() if k not in ("bertscore_encoder", "bertscore_layer")}  # a run from before the setting
    assert "supervised: encoder and layer not recorded" in metrics_table("nlg", [("icl", mini), ("supervised", old)])
    no_bs = {k: v for k, v in mini.items() if not k.startswith("bertscore")}  # --no-bertscore: nothing to compare
    assert "not comparable" not in metrics_table("nlg", [("icl", mini), ("supervised", no_bs)])


def _qa_records(n_options: int, mcq: bool):
    opts = {chr(ord("A") + i): f"option {i}" for i in range(n_options)}
    meta = {"turns": 1, "stop_reason": "researcher_stop", "parse_attempts": 1, "parse_errors": [], "answer_changed": False}
    if mcq:
        scores = lambda i: {"accuracy/oneshot": {"value": i % 2}, "accuracy/dera": {"value": 1}}  # noqa: E731
    else:
        scores = lambda i: {f"{step}/{a}": {"value": v} for a in ("oneshot", "dera")  # noqa: E731
                            for step, v in (("bertscore", 0.5), ("llm-exact", 1), ("llm-similarity", 0.5))}
    return [record(f"q{i}", inputs={"question": "q?", "choices": list(opts.values()), "answer_index": 0}, metadata=meta, scores=scores(i))
            for i in range(4)]


def test_mcq_tables_state_the_options_and_never_show_4_option_figures_beside_5():
    from experiments.studies.dera import report
    from experiments.studies.dera.settings import QASettings

    s = QASettings(mcq=True)
    m = report.qa_metrics(_qa_records(5, True), s)
    assert m["mcq_options"] == {"5": 4}
    text = report.qa_summary(m, s, "dera-qa")
    assert "5 options, A–E" in text and "MCQ accuracy (5 options, A–E)" in text
    assert "0.834" not in text and "0.840" not in text and "not comparable" in text
    m4 = report.qa_metrics(_qa_records(4, True), s)
    text4 = report.qa_summary(m4, s, "dera-qa")
    assert "4 options, A–D" in text4 and "0.834" in text4 and "4-option MedQA" in text4


def test_open_ended_table_names_bertscore_encoder_and_layer():
    from experiments.studies.dera import report
    from experiments.studies.dera.settings import QASettings

    s = QASettings()
    m = report.qa_metrics(_qa_records(5, False), s)
    assert m["bertscore"]["layer"] == 6 and m["bertscore"]["encoder"].startswith("all-MiniLM-L6-v2")
    text = report.qa_summary(m, s, "dera-qa")
    assert "BERTScore F1 (all-MiniLM-L6-v2" in text and "layer 6)" in text
    assert "0.834" not in text  # MCQ figures belong to MCQ tables only
