// Placeholder: the implementation of grammar.h lands here.
#include "grammar/grammar.h"
