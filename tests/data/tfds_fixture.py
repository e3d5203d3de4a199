"""A real TFDS translation dataset, prepared in a temporary data dir (nothing patched)."""

from __future__ import annotations

import tensorflow_datasets as tfds

NAME = "kt_tiny_translate"


def sentence_pairs(split: str, size: int) -> list[tuple[str, str]]:
    """(en, de) pairs, each one unique; every 7th pair of the training split has an empty
    German side (dropped when read)."""
    return [
        (f"{split} sentence number {i} .", "" if split == "train" and i % 7 == 3 else f"Satz {i} .")
        for i in range(size)
    ]


class KtTinyTranslate(tfds.core.GeneratorBasedBuilder):
    """en-de pairs in several shards, so that reading order and file order can differ."""

    VERSION = tfds.core.Version("1.0.0")
    SIZES = {"train": 1200, "validation": 40}

    def _info(self):
        features = tfds.features.FeaturesDict(
            {"en": tfds.features.Text(), "de": tfds.features.Text()}
        )
        return self.dataset_info_from_configs(features=features, supervised_keys=("en", "de"))

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in self.SIZES}

    def _generate_examples(self, split):
        for i, (en, de) in enumerate(sentence_pairs(split, self.SIZES[split])):
            yield i, {"en": en, "de": de}


def prepare(data_dir: str) -> str:
    """Prepare the dataset in `data_dir` (TFDS writes data_dir/kt_tiny_translate/1.0.0)."""
    builder = KtTinyTranslate(data_dir=data_dir)
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(max_examples_per_split=None)
    )
    return data_dir
