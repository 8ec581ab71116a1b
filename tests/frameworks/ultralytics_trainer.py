"""A YOLO trainer as an Ultralytics user writes it, run as a rank by ultralytics_under_agent.py.

    ultralytics_trainer.py DATA_YAML OUT_DIR
    ultralytics_trainer.py --make-data WORK_DIR OUT_DIR   (makes WORK_DIR's dataset and offline
                                                          settings first: a pod's own data)

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
import os
import shutil
import sys
import time

IMAGES = 32


def make_dataset(work):
    """The dataset and its YAML; returns the YAML's path."""
    import cv2
    import numpy as np

    rng = np.random.RandomState(7)
    images, labels = os.path.join(work, "images", "train"), os.path.join(work, "labels", "train")
    os.makedirs(images)
    os.makedirs(labels)
    for n in range(IMAGES):
        img = np.full((64, 64, 3), rng.randint(0, 80), dtype=np.uint8)
        rows = []
        for _ in range(rng.randint(1, 4)):
            cls = rng.randint(0, 2)
            w, h = rng.randint(12, 30), rng.randint(12, 30)
            x, y = rng.randint(0, 64 - w), rng.randint(0, 64 - h)
            color = (200, 60, 60) if cls == 0 else (60, 200, 60)
            img[y:y + h, x:x + w] = color
            rows.append("%d %.6f %.6f %.6f %.6f" % (cls, (x + w / 2) / 64, (y + h / 2) / 64,
                                                     w / 64, h / 64))
        cv2.imwrite(os.path.join(images, "im%02d.png" % n), img)
        with open(os.path.join(labels, "im%02d.txt" % n), "w") as f:
            f.write("\n".join(rows) + "\n")
    data = os.path.join(work, "data.yaml")
    with open(data, "w") as f:
        f.write("path: %s\ntrain: images/train\nval: images/train\nnames:\n  0: red\n  1: green\n"
                % work)
    return data


def offline_env(work):
    import matplotlib

    config = os.path.join(work, "config")
    os.makedirs(config, exist_ok=True)
    font = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf",
                        "DejaVuSans.ttf")
    shutil.copyfile(font, os.path.join(config, "Arial.ttf"))
    return {"YOLO_OFFLINE": "true", "YOLO_AUTOINSTALL": "false", "YOLO_CONFIG_DIR": config,
            "MPLCONFIGDIR": os.path.join(work, "mpl")}




def main():
    if sys.argv[1] == "--make-data":
        work, out = sys.argv[2], sys.argv[3]
        data = make_dataset(work)
        os.environ.update(offline_env(work))
    else:
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
