"""A YOLO trainer as an Ultralytics user writes it, run as a rank by ultralytics_under_agent.py.

    ultralytics_trainer.py DATA_YAML OUT_DIR

Trains YOLO('yolov8n.yaml') (built from its YAML: no weights to download) on the small
dataset DATA_YAML names, on CPU, 3 epochs, deterministic, seed 0, close_mosaic=1 (so the last
epoch's DataLoader is re-made, as Ultralytics does when it turns mosaic off), and prints one
line 'SPAWNPOINT-YOLO {json}':
  losses      per epoch, the mean losses Ultralytics reports (trainer.tloss: box, cls, dfl)
  iterators   per epoch, the train DataLoader's iterator class and its id()
  workers     per epoch, the DataLoader's num_workers
  first_batch_s   seconds from model.train() to the first training batch in hand
  ultralytics, torch   versions

Ultralytics turns DataLoader workers off on CPU (engine/trainer.py: "faster CPU training as time
dominated by inference, not dataloading"); a callback turns them back on (2), so that the
DataLoader is built and iterated as in a GPU run, the path the agent's pool must serve.
Nothing else here knows about spawnpoint.
"""

import json
import sys
import time


def main():
    data, out = sys.argv[1], sys.argv[2]
    import torch
    import ultralytics
    from ultralytics import YOLO

    record = {"losses": [], "iterators": [], "workers": [], "first_batch_s": None,
              "ultralytics": ultralytics.__version__, "torch": torch.__version__}
    started = time.monotonic()

    def workers_on(trainer):
        trainer.args.workers = 2

    def batch_start(trainer):
        if record["first_batch_s"] is None:
            record["first_batch_s"] = time.monotonic() - started

    def epoch_end(trainer):
        loader = trainer.train_loader
        record["losses"].append({k: float(v) for k, v in trainer.tloss.items()})
        record["iterators"].append([type(loader.iterator).__name__, id(loader.iterator)])
        record["workers"].append(loader.num_workers)

    model = YOLO("yolov8n.yaml")
    model.add_callback("on_pretrain_routine_start", workers_on)
    model.add_callback("on_train_batch_start", batch_start)
    model.add_callback("on_train_epoch_end", epoch_end)
    model.train(data=data, epochs=3, imgsz=64, batch=4, device="cpu", workers=2, seed=0,
                deterministic=True, close_mosaic=1, val=False, plots=False, amp=False,
                cache=False, project=out, name="run", exist_ok=True, verbose=False)
    print("SPAWNPOINT-YOLO " + json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
