// Placeholder: the implementation of gbnf_builder.h lands here.
#include "grammar/gbnf_builder.h"
