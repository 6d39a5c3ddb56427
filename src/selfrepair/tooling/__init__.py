"""Tools for the workflow and its documents, not shared computation: where a run stands
(``status``) and the documents' tables rendered from the reference files
(``readme_table``). They may import any layer of the library; nothing in it imports them."""
