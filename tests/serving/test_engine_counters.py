"""Per-answer draft counters from the engines' Prometheus counters read around each request."""

from draftsmith.engines.engine_requests import EngineAnswer, count_answer


def test_an_answer_gets_its_drafts_and_accepted_tokens_per_position():
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    before = {"vllm:spec_decode_num_drafts_total{engine=\"0\"}": 10.0,
              f'{name}{{engine="0",position="0"}}': 6.0, f'{name}{{engine="0",position="1"}}': 2.0}
    after = {"vllm:spec_decode_num_drafts_total{engine=\"0\"}": 14.0,
             f'{name}{{engine="0",position="0"}}': 9.0, f'{name}{{engine="0",position="1"}}': 3.0,
             f'{name}{{engine="0",position="2"}}': 1.0}
    answer = EngineAnswer(tokens=[1, 2], predicted_ms=1.0)
    count_answer(answer, before, after, 3, "vllm")
    assert answer.drafts == 4 and answer.accepted_per_position == [3, 1, 1]
