"""SFT rows (cold-start data, spec §6): the converters that make them from data and real tools, and the
row format itself. The recipes over them: recipes/sft_data.py, recipes/web_sft_data.py (writing the
files) and recipes/sft.py (training on them).

    rows.py     the row layout: assemble a response from pieces, read, tokenize (prompt, response, loss
                mask, as the rollout tokenizes) and write rows with the reasons rows were dropped
    convert.py  GSM8K, SVAMP, HotpotQA, hop2, rejection-sampled and worked-example rows
    web.py      deep-search rows through web_search + browse (HotpotQA-style and webhop)
"""
