"""Bad-input catalogue cases of the ux area: names and paths that try to drive the terminal or
a spreadsheet.

Each input is written for real: a TF2 checkpoint by ``tf.train.Checkpoint`` whose attribute
names hold ESC/BEL/CR/LF/TAB and a bidirectional override; a name-based bundle whose keys are
spreadsheet formulas and terminal escapes, written by TensorFlow's SaveV2 through the
project's own writer (``ckptinspect.formats.tf.write.through_tf.write_bundle``); Keras 3 files (``.weights.h5``,
legacy ``.h5``, ``.keras``) whose layer names hold escapes and formulas; and a checkpoint
whose file name itself holds ESC and a newline. Every command must print them escaped (one
row per variable, one ``Error:`` line), never raw.
"""

from __future__ import annotations

import pathlib
import shutil

import numpy as np

from catalogue import RUN, Case

# Attribute names for tf.train.Checkpoint (TF escapes "/" and "." in keys, nothing else).
TF2_NAMES = {
    "clear\x1b[2J\x1b[Hscreen": 0.0,
    "bell\x07": 1.0,
    "cr\rover": 2.0,
    "line\nbreak": 3.0,
    "tab\tname": 4.0,
    "bidi\u202eevil": 5.0,
}
# Keys of a name-based bundle: formulas a spreadsheet would run, and terminal escapes
# (OSC 0 sets the window title; CSI 2J clears the screen).
FORMULA_KEYS = {
    '=HYPERLINK("http://evil.example/x","click")': np.arange(4, dtype=np.float32) - 2.5,
    "@SUM(1+1)*cmd|' /C calc'!A0": np.ones((2, 2), np.float32),
    "+1+2": np.zeros(3, np.float32),
    "-2+3": np.full(2, -1.5, np.float32),
    "\x1b]0;pwned\x07title": np.arange(3, dtype=np.int64),
    "dense/kernel\r\nfake row": np.eye(2, dtype=np.float32),
}
KERAS_LAYER_NAMES = ('=HYPERLINK("http:evil")\x1b[2J', "@SUM(1+1)\r\nrow")
ESCAPED_FILE_NAME = "ckpt\x1b[2J\nx"


def tf2_names_with_escapes(d: pathlib.Path) -> pathlib.Path:
    import tensorflow as tf  # noqa: PLC0415

    d.mkdir(parents=True, exist_ok=True)
    root = tf.Module()
    for name, value in TF2_NAMES.items():
        setattr(root, name, tf.Variable(np.full((2,), value, np.float32)))
    return pathlib.Path(tf.train.Checkpoint(model=root).write(str(d / "ckpt")))


def formula_keys(d: pathlib.Path) -> pathlib.Path:
    from ckptinspect.formats.tf.write.through_tf import BundleTensor, write_bundle  # noqa: PLC0415

    d.mkdir(parents=True, exist_ok=True)
    prefix = d / "formulas"
    write_bundle(str(prefix), [BundleTensor(key=k, read=lambda v=v: v, nbytes=v.nbytes) for k, v in FORMULA_KEYS.items()])
    return prefix


def _keras_model():
    import keras  # noqa: PLC0415

    inp = keras.Input((3,))
    x = keras.layers.Dense(2, name=KERAS_LAYER_NAMES[0])(inp)
    x = keras.layers.Dense(2, name=KERAS_LAYER_NAMES[1])(x)
    return keras.Model(inp, x)


def keras_weights_with_escapes(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    _keras_model().save_weights(d / "m.weights.h5")
    return d / "m.weights.h5"


def keras_h5_with_escapes(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    _keras_model().save(d / "m.h5")
    return d / "m.h5"


def keras_zip_with_escapes(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    _keras_model().save(d / "m.keras")
    return d / "m.keras"


def file_name_with_escapes(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    for f in RUN.glob("ckpt-8.*"):
        shutil.copy(f, d / (ESCAPED_FILE_NAME + f.name[len("ckpt-8"):]))
    return d / ESCAPED_FILE_NAME


def missing_path_with_escapes(d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    return d / "gone\x1b[2J\r\nError: fake second line"


ESC_FILE = "ckpt\\x1b[2J\\nx"  # ESCAPED_FILE_NAME as every command prints it

CASES = [
    Case("tf2-names-with-escapes", tf2_names_with_escapes, {
        "ls": (0, "model/clear\\x1b[2J\\x1b[Hscreen  [2] … model/bell\\x07 … model/cr\\rover … model/line\\nbreak"
                  " … model/tab\\tname … model/bidi\\u202eevil"),
        "ls-stats": (0, "model/line\\nbreak"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 7 tensors"),
        "diff": (1, "model/clear\\x1b[2J\\x1b[Hscreen … removed"),
        "extract": (0, "read back bit-identical"),
    }),
    Case("formula-keys", formula_keys, {
        "ls": (0, '=HYPERLINK("http://evil.example/x","click") … \\x1b]0;pwned\\x07title … dense/kernel\\r\\nfake row'),
        "ls-stats": (0, "\\x1b]0;pwned\\x07title"),
        "verify": (0, "verdict: INTACT: 1 of 1 checkpoint whole, 6 tensors"),
        "diff": (1, "@SUM(1+1)*cmd|' /C calc'!A0"),
        "extract": (0, "read back bit-identical"),
    }),
    Case("keras-weights-names-with-escapes", keras_weights_with_escapes, {
        "ls": (0, '=HYPERLINK("http:evil")\\x1b[2J/vars/0 … @SUM(1+1)\\r\\nrow/vars/1'),
        "verify": (0, "verdict: INTACT"),
        "diff": (1, "@SUM(1+1)\\r\\nrow"),
        "extract": (0, "read back bit-identical … name-based TF bundle"),
    }),
    Case("keras-h5-names-with-escapes", keras_h5_with_escapes, {
        "ls": (0, '=HYPERLINK("http:evil")\\x1b[2J/kernel … @SUM(1+1)\\r\\nrow/bias'),
        "verify": (0, "verdict: INTACT"),
        "diff": (1, "@SUM(1+1)\\r\\nrow"),
        "extract": (0, "read back bit-identical … name-based TF bundle"),
    }),
    Case("keras-zip-names-with-escapes", keras_zip_with_escapes, {
        "ls": (0, '=HYPERLINK("http:evil")\\x1b[2J/kernel … @SUM(1+1)\\r\\nrow/bias'),
        "verify": (0, "verdict: INTACT"),
        "diff": (1, "@SUM(1+1)\\r\\nrow"),
        "extract": (0, "read back bit-identical … name-based TF bundle"),
    }),
    Case("file-name-with-escapes", file_name_with_escapes, {
        "ls": (0, f"path:    {{d}}/{ESC_FILE}"),
        "verify": (0, f"path:    {{d}}/{ESC_FILE}"),
        "diff": (0, f"a: {{d}}/{ESC_FILE} (tf-bundle)"),
        "extract": (0, f"source:   {{d}}/{ESC_FILE} (tf-bundle)"),
    }),
    Case("missing-path-with-escapes", missing_path_with_escapes, {
        cmd: (2, "Error: {d}/gone\\x1b[2J\\r\\nError: fake second line: no such file")
        for cmd in ("ls", "ls-stats", "verify", "diff", "extract")
    }),
]
