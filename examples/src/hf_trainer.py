"""A Hugging Face Trainer run as anyone writes one: a tiny GPT-2 built from a config (no
download), random tokens, Trainer's own DDP from the RANK/WORLD_SIZE/MASTER_* environment
the launcher gives every rank. Nothing in it knows about jupyter-dist: the loss, learning
rate and grad norm Trainer prints, and its tqdm bar, become the job's curves and progress.

    python hf_trainer.py [--steps 40] [--log-every 5]
"""

import argparse
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, count: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, vocab, (count, length), generator=generator)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--log-every", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        n_positions=32,
        vocab_size=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as output:
        training = TrainingArguments(
            output_dir=output,
            max_steps=args.steps,
            logging_steps=args.log_every,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(model=model, args=training, train_dataset=RandomTokens(256, 32, 256))
        trainer.train()


if __name__ == "__main__":
    main()
