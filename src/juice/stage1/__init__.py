"""Stage 1 (paper Sec. 3.2, App. E): head scores, the selection, the heads file, and the labelled
approximations. The names are importable from here.
"""

from juice.stage1.approximate import attribution_scores, head_attributions, hybrid_scores, shortlist
from juice.stage1.heads_file import HeadsArtifact, HeadsFileMismatchError, load_heads, make_artifact, save_heads
from juice.stage1.scoring import (
    ALPHAS_NEGATIVE,
    ALPHAS_POSITIVE,
    HeadScores,
    ScoringPrompt,
    score_heads,
    scoring_prompts,
    select_heads,
)

__all__ = [
    "ALPHAS_NEGATIVE", "ALPHAS_POSITIVE", "HeadScores", "HeadsArtifact", "HeadsFileMismatchError", "ScoringPrompt",
    "attribution_scores", "head_attributions", "hybrid_scores", "load_heads", "make_artifact", "save_heads",
    "score_heads", "scoring_prompts", "select_heads", "shortlist",
]
