"""Checkpoints in the Hugging Face layout: `config.json` + `model.safetensors` (+ `vocab.txt`).

Loading is strict where it matters and smooth where users expect it to be:
  * the encoder's weights (under the model family's `base_model_parts`: `embeddings.*`, `encoder.*`) must all
    be there, with the right shapes;
  * a head the checkpoint lacks (a classifier on top of a pre-trained encoder) is initialised and reported;
  * head weights -- any module weight outside the encoder -- the model has no use for (MLM/NSP heads when
    fine-tuning) are reported and dropped;
  * anything else -- a missing encoder weight, an unknown key inside the encoder or one that is no module
    path (an unmapped TensorFlow name), a shape that does not fit -- is a `CheckpointError` listing the keys.
    There is never a silent partial load.
This module knows files and these rules, not models: what is the encoder, its prefix in `BertFor*`
checkpoints (`bert.`), its config class and tied weights are attributes of the model class it is given, so
every model family and every head loads through the same code. Both bare `BertModel` keys and
`bert.`-prefixed `BertFor*` keys are accepted, as are the `gamma`/`beta` LayerNorm names of early TensorFlow
conversions. Weights are read only from safetensors or, for `pytorch_model.bin`, through
`torch.load(weights_only=True)`, which cannot run code; a folder holding Google's TensorFlow
`bert_model.ckpt.index` (or that `.index` file) is read through the model class's `read_tf_checkpoint` hook
(BERT's: `models/bert/tf_names.py`), without TensorFlow.

Saving is atomic: everything is written into a temporary sibling folder which then replaces the target,
so a crash mid-save leaves the previous checkpoint as it was; the temporary folders of a process that died
are removed by the next save of that target (`remove_stale_temporaries`). Saved folders and files follow
the umask, like any other tool's output. A failed write (disk full, read-only) is one `OutputError` line.

The package: `hf_layout.py` (file names, key rules, reading, loading, writing full weights), `peft.py` (LoRA
adapter folders in PEFT's layout) and `pretrained.py` (`load_pretrained` / `save_pretrained`, which send a
folder to one or the other); the atomic writes are `bertlab.core.fsio`'s. Every name is importable from here.
"""

from ..core.fsio import (apply_umask, atomic_directory, atomic_write_text, current_umask,  # noqa: F401
                    remove_stale_temporaries)
from ..tokenizer.base import VOCAB_NAME  # noqa: F401
from .hf_layout import (CONFIG_NAME, DEFAULT_BASE_PREFIX, FULL_WEIGHT_FILES, PYTORCH_WEIGHTS_NAME,  # noqa: F401
                        TF_INDEX_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, LoadReport, Model, build_and_load,
                        canonical_key, canonical_state_dict, check_state_dict, index_shards, initialize_missing,
                        load_state_dict_into, materialize, model_keys, model_state_dict, read_state_dict,
                        resolve_dir, torch_load_failure, write_model_folder)
from .peft import (ADAPTER_CONFIG_NAME, ADAPTER_FILES, ADAPTER_WEIGHTS_NAME, PEFT_PREFIX,  # noqa: F401
                   PEFT_TASK_TYPES, is_lora_adapter_folder, load_lora_adapter, save_lora_adapter)
from .pretrained import load_pretrained, save_pretrained  # noqa: F401
