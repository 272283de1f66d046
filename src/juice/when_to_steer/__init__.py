"""When to steer: the same questions with a gold, a conflicting, an irrelevant, a distracting and no
passage (the items: :mod:`juice.data.context_types`), every method, both objectives; and `auto`,
the method that decides per request whether to steer.

- :mod:`juice.when_to_steer.signals`: the first-step signals a request is judged by (AdaCAD's JSD,
  the relevance gate's signals);
- :mod:`juice.when_to_steer.auto`: `auto`'s policy, its candidates and its registry entry's build;
- :mod:`juice.when_to_steer.classifier`: a signal as a classifier of "this passage answers the
  question": AUROC with intervals over questions, reliability bins;
- :mod:`juice.when_to_steer.evaluation`: decoding and scoring the items per context type, the
  tables and the question-resampled intervals;
- :mod:`juice.when_to_steer.contexts`: end to end (`juice evaluate --contexts`): the sources, the
  methods, the summary, the files written;
- :mod:`juice.when_to_steer.auto_tuning`: tuning `auto` on validation items;
- :mod:`juice.when_to_steer.study`: the study (`juice evaluate --contexts --study`): methods and
  `auto` chosen on validation questions, reported on test questions; every method decoded once;
- :mod:`juice.when_to_steer.outcomes`: a study's decoded verdicts and first-step signals per item,
  what the offline analyses read;
- :mod:`juice.when_to_steer.preregistered`: the pre-registered analysis, `auto` minus the best
  static method in every design, with intervals;
- :mod:`juice.when_to_steer.harm`: do no harm, what each method does with passages that do not
  answer, and risk-coverage curves.
"""

from juice.when_to_steer.evaluation import MEAN
from juice.when_to_steer.contexts import (SUMMARIZED, ContextsEvaluation, best_static_method, context_items,
                                        context_methods, evaluate_contexts, prompt_fits, summarize, summary_table)

__all__ = ["MEAN", "SUMMARIZED", "ContextsEvaluation", "best_static_method", "context_items", "context_methods",
           "evaluate_contexts", "prompt_fits", "summarize", "summary_table"]
