"""The paper's mechanistic studies and robustness sweeps (`juice analyze ...`).

Each study is a function `run_<name>(lm, options, progress) -> <Name>Result` that writes JSON,
a Markdown table and a PNG figure into `options.out`:

- :func:`juice.analysis.knockout.run_knockout`: Fig. 3, knock-out of whole layers, attention and
  MLP outputs (Sec. 3.1, Observation 1);
- :func:`juice.analysis.superposition.run_superposition`: the superposition table (Sec. 3.1);
- :func:`juice.analysis.multiple.run_multiple`: Table 3 and Fig. 6, cumulative knock-out of the
  top heads, run once (JuNE-style) and run twice (JuICE-style) (Sec. 3.1 Observation 2, Sec. 4.4);
- :func:`juice.analysis.robustness.run_robustness`: Fig. 5, JuICE and JuNE against |D|, K and
  (beta+, beta-) (Sec. 4.3);
- :func:`juice.analysis.paraphrase.run_paraphrase`: the App. D paraphrase table;
- :func:`juice.analysis.norm.run_norm`: beyond the paper, steering before vs after the attention
  output norm (Gemma 2/3).

Shared options, items and output files: :mod:`juice.analysis.common`.
"""

from juice.analysis.common import AnalysisOptions, WorldCapitalItems, world_capital_items, write_outputs
from juice.analysis.knockout import KnockoutResult, run_knockout
from juice.analysis.multiple import MultipleResult, run_multiple
from juice.analysis.norm import NormResult, run_norm
from juice.analysis.paraphrase import ParaphraseResult, run_paraphrase
from juice.analysis.robustness import RobustnessResult, run_robustness
from juice.analysis.superposition import SuperpositionResult, run_superposition

__all__ = ["AnalysisOptions", "KnockoutResult", "MultipleResult", "NormResult", "ParaphraseResult", "RobustnessResult",
           "SuperpositionResult", "WorldCapitalItems", "run_knockout", "run_multiple", "run_norm", "run_paraphrase",
           "run_robustness", "run_superposition", "world_capital_items", "write_outputs"]
