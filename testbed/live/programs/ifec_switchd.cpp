// ifec-switchd: one switch of a topology on its interfaces (see daemons.h).
#include "ifec/live/daemons.h"

int main(int argc, char** argv) { return ifec::live::switchd_main(argc, argv); }
