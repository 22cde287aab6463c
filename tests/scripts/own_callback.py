"""A script that adds leakdoctor's own callback to its Trainer or fit, as the README shows (run by
tests/test_run.py under `leakdoctor run`, unedited: the run joins this callback rather than adding a second
one). `own_callback.py {lightning|keras} STEPS`: Lightning trains tests/scripts/lightning_outputs.py's module
(every loss kept, graph and all); Keras fits one small model. The callback sets `plot_path` and no
`summary_path`: the run's --summary applies, its --plot does not."""

import logging
import os
import sys
import warnings

warnings.filterwarnings("ignore")
kind = sys.argv[1] if len(sys.argv) > 1 else "lightning"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 120
plot = os.path.abspath("own.png")

if kind == "lightning":
    import lightning.pytorch as L
    import torch
    from lightning_outputs import Leaky

    from leakdoctor.callbacks.lightning import LeakDoctorCallback

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    x = torch.randn(steps * 32, 32)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=32)
    doctor = LeakDoctorCallback(plot_path=plot)
    trainer = L.Trainer(max_steps=steps, logger=False, accelerator="cpu", enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, callbacks=[doctor])
    trainer.fit(Leaky(), data)
    print(f"trained {trainer.global_step} steps")
else:
    import keras
    import numpy as np

    from leakdoctor.callbacks.keras import LeakDoctorCallback

    rng = np.random.default_rng(0)
    x = rng.normal(size=(steps * 8, 16)).astype("float32")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    doctor = LeakDoctorCallback(plot_path=plot)
    model.fit(x, x[:, :1], epochs=1, batch_size=8, verbose=0, callbacks=[doctor])
    model.evaluate(x, x[:, :1], batch_size=64, verbose=0, callbacks=[doctor])
    doctor.finish()
    print(f"trained {steps} steps")
