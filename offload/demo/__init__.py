"""The main demo (``offload demo``): one section a module, each returning whether its checks held."""

from offload.demo.main import SECTIONS, run_demo, section_fixed_point, section_mlp, section_partition, section_serve

__all__ = ["SECTIONS", "run_demo", "section_fixed_point", "section_mlp", "section_partition", "section_serve"]
