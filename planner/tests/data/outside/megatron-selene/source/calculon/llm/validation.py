# calculon/llm/validation.py, function seqsel_tab5, reduced to its
# table of measured seconds (the paper's Table 5).
def seqsel_tab5():
    kProfile = {
      "megatron-22B": {
        "full": 1.42,
        "seqsel": 1.1
      },
      "gpt3-175B": {
        "full": 18.13,
        "seqsel": 13.75
      },
      "turing-530B": {
        "full": 49.05,
        "seqsel": 37.83
      },
      "megatron-1T": {
        "full": 94.42,
        "seqsel": 71.49
      }
    }
