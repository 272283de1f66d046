"""Data folders written for the tests: the authors' ParaConflict layout and a tiny MemoTrap and
NQ-Swap."""

from __future__ import annotations

import csv
import json
import shutil


def authors_layout(shared_data, root, repeat_test_subject: bool = True):
    """The authors' repository as it is (`dataset/factual/<domain>_gemma/head_size_4/`), with
    World Capital and an Official-Language-like copy whose test split repeats its first subject
    with another distractor (the paper's Official Language test split holds Australia twice)."""
    factual = root / "dataset" / "factual"
    for name in ("world_capital", "capital_copy"):
        shutil.copytree(shared_data / "paraconflict" / "world_capital", factual / f"{name}_gemma" / "head_size_4")
    if repeat_test_subject:
        path = factual / "capital_copy_gemma" / "head_size_4" / "unfiltered_test.json"
        test = json.loads(path.read_text())
        again = dict(test[0], **{"Distracted Token": "Kazak"})
        for key in ("Substitution Conflict", "Coherent Conflict"):
            again[key] = test[0][key].replace(test[0]["Distracted Token"], "Kazak")
        path.write_text(json.dumps([test[0], again, *test[1:]]))
    (factual / "world_capital.json").write_text("[]")       # the authors' other files are not domains
    (factual / "world_capital_gemma" / "head_size_1").mkdir()
    return factual


def write_contextual_data(root):
    """A tiny MemoTrap (its four files, 14 rows each) and NQ-Swap (14 rows) under `root`, in the tiny
    models' words: the contextual pipeline's (Table 2's) data."""
    words = "paris berlin tokyo madrid rome golf tennis".split()
    (root / "memotrap").mkdir(parents=True)
    for name in ("1-proverb-ending.csv", "2-proverb-translation.csv", "3-hate-speech-ending.csv",
                 "4-history-of-science-qa.csv"):
        with open(root / "memotrap" / name, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f)
            w.writerow(["prompt", "classes", "answer_index"])
            for i in range(14):
                a, b = words[i % 7], words[(i + 3) % 7]
                if name.startswith("2"):
                    prompt = f"translate w{i} w{i + 1}\nto:\nthe capital of france is"
                elif name.startswith("4"):
                    prompt = f"what was w{i} .\nA. {a}\nB. {b}\nAnswer:"
                else:
                    prompt = f'write "{a}": the capital of w{i} is'
                w.writerow([prompt, str([f" {a}", f" {b}"]), i % 2])
    (root / "nqswap").mkdir()
    with open(root / "nqswap" / "nqswap.jsonl", "w", encoding="utf-8") as f:
        for i in range(14):
            a, b = words[i % 7], words[(i + 2) % 7]
            f.write(json.dumps({"question": f"what is w{i}", "org_context": f"<P> w{i} is {b} </P>",
                                "org_answer": [b], "sub_context": f"<P> w{i} is {a} </P>", "sub_answer": [a]}) + "\n")
