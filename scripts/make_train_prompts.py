#!/usr/bin/env python3
"""Make a prompt corpus for self-distilling Medusa heads (examples/train_prompts.jsonl).

What it makes
-------------
JSON lines in specq's input format, one request per line::

    {"custom_id": "train-0001", "category": "qa", "prompt": "...", "max_tokens": 192}
    {"custom_id": "train-0002", "category": "multi_turn", "messages": [...], "max_tokens": 192}

The model's own answers to these prompts later become the training targets for
Medusa heads that predict tokens 2..5 positions ahead, so the corpus aims for
breadth rather than difficulty. Prompts come from many hand-written templates
combined with hand-written topics, sentences and passages, across 17 categories:
multi_turn, translation, summarization, qa, math, context_qa, code, explanation,
list, how_to, creative, email, classification, rewrite, comparison, definition
and dialogue. Summarization and context_qa reuse ~48 short original passages
(60-150 words each); math word problems get their numbers from the seeded RNG.

Guarantees (checked every run; the script exits with an error otherwise):

* deterministic: every random choice comes from random.Random seeded from a
  fixed string per category, so reruns produce a byte-identical file;
* at least 1000 prompts, no two identical (prompt text, or full message list);
* no prompt identical to one in examples/bench_prompts.jsonl or
  examples/prompts.jsonl, and no passage sharing an 8-word run with the bench
  file (the benchmark must stay held out);
* every passage is 60-150 words.

Rerun
-----
    python scripts/make_train_prompts.py > examples/train_prompts.jsonl
    python scripts/make_train_prompts.py examples/train_prompts.jsonl

Per-category counts are printed to stderr. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import textwrap
from pathlib import Path

SEED = "specq-train-prompts-v1"
MAX_TOKENS = 192
MIN_TOTAL = 1000
REPO = Path(__file__).resolve().parent.parent
# Prompt files that must stay disjoint from the training corpus.
HELD_OUT = (REPO / "examples" / "bench_prompts.jsonl", REPO / "examples" / "prompts.jsonl")

# How many prompts to take per category (None = every candidate).
TARGETS = {
    "multi_turn": 70,
    "translation": 70,
    "summarization": None,  # two prompts per passage
    "qa": 70,
    "math": 70,
    "context_qa": None,  # every passage question
    "code": 72,
    "explanation": 65,
    "list": 60,
    "how_to": 60,
    "creative": 65,
    "email": 60,
    "classification": 65,
    "rewrite": 65,
    "comparison": 60,
    "definition": 60,
    "dialogue": 60,
}


def norm(text: str) -> str:
    """Collapse runs of whitespace (passages are written wrapped in the source)."""
    return " ".join(text.split())


def code_block(src: str) -> str:
    return "```python\n" + textwrap.dedent(src).strip("\n") + "\n```"


# ---------------------------------------------------------------------------
# Passages (original text) for summarization and context_qa:
# (title, text, [questions answerable from the text])
# ---------------------------------------------------------------------------
PASSAGES = [
    ("The history of Alderbury", """
Alderbury began in the twelfth century as a handful of farms clustered around a
water mill on the River Wend. The mill ground grain for villages up to a day's
walk away, and a weekly market soon grew up beside it. In the 1700s the town
became known for its wool, and several large weaving sheds were built along the
riverbank. The arrival of the canal in 1794 allowed cloth to be shipped cheaply
to the coast, and the population doubled within forty years. When the wool trade
declined in the early twentieth century, many of the sheds were converted into
workshops and homes. Today the old mill houses a small museum, and the market is
still held every Thursday.""",
     ["When did the canal reach Alderbury, and what difference did it make?",
      "What is the old mill used for today?",
      "What was the town known for in the 1700s?"]),
    ("How bees make honey", """
Honey begins as nectar, a sugary liquid that flowers produce to attract insects.
A forager bee sucks up nectar with its long tongue and stores it in a special
honey stomach, where enzymes start to break down the sugars. Back at the hive,
the forager passes the nectar to house bees, who pass it from bee to bee, adding
more enzymes. The bees then spread the liquid in wax cells and fan it with their
wings so that water evaporates. When the water content falls to about eighteen
percent, the nectar has become honey, and the bees seal the cell with a cap of
wax. A single bee makes only a small fraction of a teaspoon of honey in its
lifetime.""",
     ["How do bees remove water from the nectar?",
      "What do bees do once the honey is ready?"]),
    ("Northwind Tools opens a new plant", """
Northwind Tools announced on Monday that it will open a new manufacturing plant
in the town of Carver Falls next spring. The plant will produce cordless drills
and saws and is expected to employ about 350 people once it reaches full
production. The company said it chose Carver Falls because of its access to the
regional rail line and a local technical college that already offers courses in
machine maintenance. Construction of the 20,000-square-metre building began last
month. Northwind's chief executive, Dana Ruiz, said the new site would allow the
company to cut delivery times to customers in the north by up to three days.
Hiring for the first 120 positions will begin in January.""",
     ["How many people will the plant employ at full production?",
      "Why did Northwind choose Carver Falls?",
      "When will hiring begin, and for how many positions?"]),
    ("How rainbows form", """
A rainbow appears when sunlight shines through drops of water in the air,
usually just after a rain shower. Sunlight looks white but is really a mixture of
many colours. When a ray of light enters a raindrop, it bends, reflects off the
back of the drop, and bends again as it leaves. Each colour bends by a slightly
different amount, so the colours spread out into a band. Red light leaves the
drops at a slightly larger angle than violet light, which is why red always
appears on the outside of the bow. To see a rainbow, you must stand with the sun
behind you and the rain in front of you. Sometimes a fainter second bow appears,
with its colours in reverse order.""",
     ["Why does red appear on the outside of a rainbow?",
      "Where must the sun be for someone to see a rainbow?"]),
    ("Gutenberg's printing press", """
Around 1440, Johannes Gutenberg, a goldsmith from Mainz, developed a printing
system based on movable metal type. Each letter was cast separately in a mixture
of lead, tin and antimony, so the pieces could be arranged into lines of text,
used for printing and then reused. Gutenberg also developed an oil-based ink that
stuck well to metal and adapted a screw press, similar to those used for pressing
grapes, to push paper evenly onto the type. His most famous work, a Bible printed
in the 1450s, showed that printed books could be as handsome as handwritten ones.
Within fifty years, printing shops had opened in more than two hundred European
towns, and books became far cheaper and more widely available.""",
     ["Which metals were used to cast Gutenberg's type?",
      "What kind of press did Gutenberg adapt for printing?"]),
    ("Elm Street Community Garden rules", """
The Elm Street Community Garden has forty raised beds, which are rented to local
residents for one growing season at a time. A bed costs 30 dollars per season, or
15 dollars for people over sixty-five. Gardeners must visit their bed at least
once a week from May to September and keep the paths around it free of weeds.
Water is available from two taps near the shed, which are turned on from 7 in the
morning until 8 in the evening. Chemical weed killers are not allowed anywhere in
the garden. Tools in the shed may be borrowed by any member but must be cleaned
and returned on the same day. Beds left untended for three weeks may be given to
the next person on the waiting list.""",
     ["How much does a bed cost for a seventy-year-old gardener?",
      "What can happen if a bed is not looked after for three weeks?",
      "Until what time in the evening can gardeners use the taps?"]),
    ("The Gray Point Lighthouse", """
The Gray Point Lighthouse was built in 1856 after a series of shipwrecks on the
rocky headland south of the harbour. The tower is 28 metres tall and made of
local granite, with walls nearly two metres thick at the base. For almost a
century, keepers lived in a cottage beside the tower with their families,
climbing the 112 steps several times each night to trim the wick and wind the
clockwork that turned the lens. The light was converted to electricity in 1931
and became fully automatic in 1962, when the last keeper left. The cottage is now
a visitor centre, and on summer weekends guests can climb to the lantern room for
a view of the coast.""",
     ["Why was the Gray Point Lighthouse built?",
      "When did the last keeper leave, and why was a keeper no longer needed?"]),
    ("How volcanoes form", """
Most volcanoes form where the large plates that make up Earth's outer shell meet.
Where one plate slides beneath another, the sinking rock carries water down with
it. The water lowers the melting point of the hot rock above, producing magma
that is lighter than the surrounding rock and slowly rises. If the magma reaches
the surface, it erupts as lava, ash and gas. Other volcanoes, such as those of
Hawaii, sit above hot spots, where plumes of unusually hot rock rise from deep
inside the planet. As a plate moves slowly over a hot spot, a chain of volcanoes
forms, with the oldest ones furthest from the plume. Sticky, gas-rich magma tends
to cause explosive eruptions, while runny magma produces gentler lava flows.""",
     ["How does water help to create magma where plates meet?",
      "Why do some volcanoes form in chains?"]),
    ("The clever octopus", """
The octopus is often described as the most intelligent invertebrate. It has
around five hundred million nerve cells, and about two thirds of them are located
in its arms rather than its central brain, which allows each arm to taste, touch
and react somewhat independently. In laboratory studies, octopuses have learned
to open screw-top jars, find their way through simple mazes and recognise
individual people. Many species change the colour and texture of their skin in a
fraction of a second to blend in with rocks or coral, using special cells called
chromatophores. Despite these abilities, most octopuses live short lives, often
only one or two years, and the mother usually dies soon after her eggs hatch.""",
     ["Where are most of an octopus's nerve cells located?",
      "How long do most octopuses live?"]),
    ("Riverton's new recycling collection", """
Starting on the first of March, the city of Riverton will change how household
recycling is collected. Instead of one bin for all recyclables, each home will
receive two bins: a blue bin for paper and cardboard, and a green bin for glass,
metal cans and plastic bottles. Both bins will be emptied every two weeks, on the
same day as the current collection. Plastic bags and food-stained pizza boxes
should not be placed in either bin. The city says the change will reduce
contamination, which currently causes about a fifth of collected material to be
sent to landfill. Residents who need a larger bin can request one free of charge
through the city's website before the end of February.""",
     ["Which bin should an empty glass jar go in?",
      "Why is the city changing the way recycling is collected?",
      "How can a household get a larger bin?"]),
    ("Green, black and oolong tea", """
Tea is made from the leaves of a single plant, Camellia sinensis, which grows
best in warm climates with plenty of rain. The differences between green, black
and oolong tea come mainly from how the leaves are processed after picking. For
green tea, the leaves are heated soon after harvest, which stops them from
oxidising and keeps their colour fresh. For black tea, the leaves are rolled and
left exposed to air until they turn dark brown before being dried. Oolong tea is
only partly oxidised, placing it between the other two in flavour. Tea drinking
began in China many centuries ago and spread along trade routes to Japan, India,
Europe and beyond.""",
     ["What makes black tea different from green tea?",
      "Which plant are green, black and oolong tea all made from?"]),
    ("Visiting the Harwell Museum of Science", """
The Harwell Museum of Science is open from Tuesday to Sunday, 10 am to 5 pm, and
until 8 pm on Thursdays. It is closed on Mondays except on public holidays.
General admission is 12 dollars for adults, 7 dollars for students and seniors,
and free for children under six. The planetarium show runs four times a day and
costs an extra 5 dollars per person; tickets often sell out on weekends, so
booking online is recommended. Large bags and backpacks must be left in the
lockers near the entrance, which require a one-dollar coin that is returned when
the locker is opened. Photography is permitted throughout the museum, but flash
is not allowed in the planetarium.""",
     ["How much would two adults and a five-year-old pay for general admission?",
      "Can visitors use flash photography in the planetarium?",
      "What time does the museum close on Thursdays?"]),
    ("How vaccines work", """
A vaccine helps the body prepare for an infection without causing the disease
itself. It contains a harmless piece or version of a germ, such as a weakened
virus, an inactivated one, or just a single protein from its surface. When the
vaccine is given, the immune system recognises these pieces as foreign and
produces antibodies and special white blood cells that target them. Some of these
cells remain in the body for years as memory cells. If the real germ later enters
the body, the memory cells recognise it quickly and the immune system can respond
much faster and more strongly than it would the first time. Some vaccines need
booster doses because this memory slowly fades over time.""",
     ["What are memory cells, and why do they matter?",
      "Why do some vaccines need booster doses?"]),
    ("The monarch butterfly migration", """
Every autumn, millions of monarch butterflies in eastern North America fly south
to spend the winter in the mountain forests of central Mexico, a journey that can
exceed four thousand kilometres. The butterflies that make this trip are not the
same ones that left Mexico the previous spring. Several generations are born and
die during the summer as the population spreads north, but the final generation
of the year lives much longer, up to eight months, and makes the entire return
flight. Scientists believe the monarchs find their way by using the position of
the sun together with an internal clock, and possibly Earth's magnetic field. In
Mexico they cluster by the thousands on fir trees, which protects them from the
cold.""",
     ["How long can the final generation of the year live?",
      "How do monarchs find their way south?"]),
    ("Lakeside Middle School science fair", """
Lakeside Middle School will hold its annual science fair on Friday, April 12, in
the school gymnasium. Students in grades six to eight may enter individually or
in teams of up to three. Each project must include a display board and a short
written report describing the question, the method and the results. Projects that
involve animals, open flames or chemicals other than common household items must
be approved by a teacher in advance. Registration forms are due to the science
department by March 15. Judging will take place in the morning, and the fair will
open to families from 2 pm to 5 pm. Winners in each grade will receive a
certificate and a place at the regional competition in May.""",
     ["What is the largest team allowed at the fair?",
      "When can families visit the fair?",
      "Which projects need a teacher's approval in advance?"]),
    ("How window glass is made", """
Ordinary window glass is made mainly from sand, which is mostly silica, mixed
with soda ash and limestone. Silica on its own melts at a very high temperature,
so soda ash is added to lower the melting point, and limestone makes the finished
glass more stable and resistant to water. The mixture is heated in a furnace to
about 1,500 degrees Celsius until it becomes a thick, glowing liquid. For flat
sheets, the molten glass is poured onto a bath of melted tin, where it spreads
out and forms a perfectly smooth surface. It is then cooled slowly in a long
oven, a step called annealing, which prevents stresses that could make it crack.
Recycled glass, called cullet, is often added because it melts more easily.""",
     ["Why is soda ash added to the sand?",
      "What is annealing, and why is it done?"]),
    ("From cacao pod to chocolate", """
Chocolate comes from the seeds of the cacao tree, which grows in warm, wet
regions near the equator. The seeds grow inside large pods that sprout directly
from the trunk and branches. After harvest, the seeds and the sticky pulp around
them are left to ferment for several days, which develops the flavour. The seeds,
now called beans, are dried in the sun, shipped to factories and roasted. The
roasted beans are cracked open and their inner pieces, called nibs, are ground
into a thick paste. Sugar, extra cocoa butter and sometimes milk are added, and
the mixture is stirred for hours to make it smooth. People in Mesoamerica were
drinking cacao beverages thousands of years before chocolate bars were invented.""",
     ["What happens to cacao seeds right after harvest?",
      "What are nibs, and what is done with them?"]),
    ("How clouds form", """
Clouds form when air containing water vapour rises and cools. Warm air can hold
more water vapour than cold air, so as a pocket of air rises and expands, its
temperature drops until the vapour begins to condense. The vapour needs something
to condense onto, and the air is full of tiny particles of dust, salt and smoke
that serve this purpose. Billions of these droplets together become visible as a
cloud. Air can be pushed upward in several ways: it can be heated by the ground
on a sunny day, forced up over mountains, or lifted when a mass of warm air meets
colder, denser air. When droplets grow large enough, they fall as rain, or as
snow if the air is cold enough.""",
     ["What do the water droplets in a cloud form around?",
      "Name two ways in which air can be pushed upward."]),
    ("What causes the tides", """
Tides are the regular rise and fall of sea level along coasts, and they are
caused mainly by the pull of the Moon's gravity. The Moon pulls slightly harder
on the side of Earth facing it than on the far side, which stretches the oceans
into two bulges, one toward the Moon and one away from it. As Earth spins, most
coastlines pass through both bulges each day, giving roughly two high tides and
two low tides about every twenty-four hours and fifty minutes. The Sun also
affects tides, though less strongly. When the Sun and Moon line up, at new moon
and full moon, their effects combine to produce especially large spring tides.
When they pull at right angles, the smaller neap tides occur.""",
     ["When do spring tides occur?",
      "Why do most coasts have two high tides a day?"]),
    ("Ledgerly 4.2 released", """
Brightleaf Software has released version 4.2 of its Ledgerly accounting app for
small businesses. The update adds support for recurring invoices, which can be
scheduled weekly, monthly or yearly, and a new dashboard that shows unpaid
invoices at a glance. The company also fixed a problem that caused some reports
to show the wrong currency symbol for customers outside the United States.
Version 4.2 is a free update for all current subscribers and will install
automatically over the next two weeks. Users who prefer to update immediately can
do so from the settings menu. Brightleaf noted that the older version 3 of the
app will stop receiving security updates at the end of the year.""",
     ["How often can recurring invoices be scheduled?",
      "Which bug was fixed in this update?",
      "What will happen to version 3 at the end of the year?"]),
    ("Camels in the desert", """
Camels are well suited to life in hot, dry deserts. Contrary to a popular belief,
a camel's hump does not store water; it stores fat, which the animal can break
down for energy when food is scarce. Camels can go for many days without drinking
and then drink more than a hundred litres of water in a few minutes. Their bodies
allow their temperature to rise during the day, so they sweat less and save
water. Thick eyelashes and nostrils that can close keep out blowing sand, and
wide, tough feet spread their weight so they do not sink into soft ground. Camels
have been used by people to carry goods across deserts for thousands of years.""",
     ["What does a camel's hump store?",
      "How are camels protected from blowing sand?"]),
    ("Reading tree rings", """
When a tree in a temperate climate grows, it adds a new layer of wood under its
bark each year. Wood formed in spring grows quickly and is pale, while wood
formed in late summer grows slowly and is darker. Together they form one visible
ring, so counting the rings on a stump reveals the tree's age. The width of each
ring also records the growing conditions of that year: wide rings usually mean
plenty of rain and warmth, while narrow rings suggest drought or cold. By
matching patterns of wide and narrow rings between living trees, old timber and
ancient wood, scientists have built records stretching back thousands of years.
This method, called dendrochronology, is used to date old buildings and to study
past climates.""",
     ["Why does each tree ring have a pale part and a dark part?",
      "What can a narrow ring tell scientists?"]),
    ("How a magnetic compass works", """
A magnetic compass works because Earth itself behaves like a giant magnet.
Currents of molten iron in the planet's outer core create a magnetic field that
stretches from deep inside the Earth out into space. The needle of a compass is a
small, light magnet balanced so that it can turn freely. It lines up with Earth's
magnetic field, so one end points roughly toward the magnetic north pole. The
magnetic pole is not in exactly the same place as the geographic North Pole, and
it slowly moves over time, so navigators use charts that show the difference in
each region. Compasses were used for navigation in China by the eleventh century
and reached Europe soon afterward.""",
     ["What creates Earth's magnetic field?",
      "Why do navigators need charts showing the difference between magnetic and geographic north?"]),
    ("The Falcon Ridge Trail", """
The Falcon Ridge Trail is a 14-kilometre loop that begins and ends at the Pine
Hollow car park. The first four kilometres follow a gentle forest path along
Miller Creek. The trail then climbs steeply for about two kilometres to the
ridge, where a viewpoint looks out over the valley. From the ridge, hikers can
either continue on the full loop or take a 3-kilometre shortcut back to the car
park, which is marked with yellow signs. Most people need five to six hours for
the complete loop. There is no drinking water along the route, and the ridge
section can be slippery after rain. Dogs are allowed but must be kept on a lead
between April and July, when birds are nesting.""",
     ["How long is the walk in total if a hiker takes the shortcut from the ridge?",
      "When must dogs be kept on a lead, and why?",
      "Can hikers refill their water bottles along the trail?"]),
    ("Emperor penguins in winter", """
Emperor penguins are the largest penguins and the only ones that breed during the
Antarctic winter. In autumn, they walk as far as a hundred kilometres across the
sea ice to their breeding colonies. After the female lays a single egg, she
passes it to the male and returns to the sea to feed. For about two months, the
male balances the egg on his feet under a warm fold of skin, eating nothing while
temperatures fall below minus forty degrees. The males huddle together in large
groups, slowly shuffling so that each bird takes turns on the windy outside. When
the chick hatches, the female returns with food in her stomach, and the thin,
hungry male finally heads to the sea.""",
     ["Which parent keeps the egg warm, and for how long?",
      "Why do the males huddle together?"]),
    ("The first postage stamp", """
Before 1840, letters in Britain were usually paid for by the person receiving
them, and the cost depended on the distance travelled and the number of sheets.
The system was complicated and expensive, and many people refused to pay for
letters they had not asked for. A teacher and reformer named Rowland Hill
proposed a simpler plan: a single low price for any letter within the country,
paid in advance by the sender. Proof of payment would be a small printed label
glued to the envelope. The result was the Penny Black, the world's first adhesive
postage stamp, which went on sale in May 1840. The number of letters sent in
Britain more than doubled within a year.""",
     ["Who usually paid for a letter before 1840?",
      "What was the Penny Black?"]),
    ("Rosemary Lane Bakery expands", """
Rosemary Lane Bakery, a family business that has sold bread on Harbour Street
since 1978, will open a second shop in the Eastgate shopping centre in June. The
new shop will be larger than the original and will include a seating area for
about thirty customers, serving coffee and light lunches. Owner Priya Malhotra
said the move was made possible by a small-business loan and by strong demand
for the bakery's sourdough and seeded rye, which often sell out before noon. All
baking will continue to take place at the Harbour Street site, with fresh
deliveries to Eastgate twice each morning. The bakery plans to hire eight new
staff, including two apprentice bakers.""",
     ["Where will the bread sold at the new shop be baked?",
      "How many new staff will the bakery hire?"]),
    ("How solar panels make electricity", """
A solar panel turns sunlight directly into electricity using cells made mostly of
silicon. Each cell contains two thin layers of silicon that have been treated
with small amounts of other elements, so that one layer has extra electrons and
the other has too few. Where the layers meet, an electric field forms. When light
strikes the cell, it knocks electrons loose, and the electric field pushes them
in one direction, creating a current that flows through wires attached to the
cell. A panel produces direct current, so homes usually use a device called an
inverter to convert it into the alternating current used by household appliances.
Panels produce less power on cloudy days, but they still work.""",
     ["What does an inverter do?",
      "What happens when light strikes a solar cell?"]),
    ("Westport City Marathon road closures", """
The Westport City Marathon will take place on Sunday, October 6, starting at 7:30
am at Victoria Park. Several roads in the city centre will be closed from 6 am
until 2 pm, including parts of King Street, the Harbour Road and the Old Bridge.
Buses will follow diversions during these hours, and route maps will be posted at
bus stops a week before the race. Residents living along the route will still be
able to leave by car, but only in the direction away from the course. About 6,000
runners are expected, and organisers are looking for 400 volunteers to staff
water stations and the finish area. Volunteers will receive a free T-shirt and
lunch.""",
     ["Between what times will the roads be closed?",
      "What will volunteers receive?"]),
    ("Earthquakes and seismic waves", """
An earthquake happens when rocks along a fault, a crack in Earth's crust,
suddenly slip past one another after stress has built up for years. The energy
released travels through the ground as seismic waves. The fastest, called P
waves, squeeze and stretch the rock and can travel through solids and liquids.
Slower S waves shake the rock from side to side and cannot pass through liquids,
a fact that helped scientists discover that Earth's outer core is molten.
Instruments called seismometers record these waves. By comparing when the waves
arrive at stations in different places, scientists can work out where an
earthquake started and how much energy it released.""",
     ["How did S waves help show that Earth's outer core is liquid?",
      "How do scientists work out where an earthquake started?"]),
    ("Early paper money in China", """
Paper money was first widely used in China. During the Tang dynasty, merchants
who traded over long distances found heavy strings of copper coins difficult to
carry, so they began leaving coins with trusted agents and receiving paper
receipts in return. These receipts could be exchanged for coins in another city.
In the early eleventh century, under the Song dynasty, the government took
control of issuing such notes in the province of Sichuan, creating one of the
first official paper currencies. The notes were printed with complex designs to
make copying difficult. However, when governments later printed too many notes,
their value fell sharply, an early example of inflation.""",
     ["Why did merchants start using paper receipts?",
      "What happened when too many notes were printed?"]),
    ("How bats use echolocation", """
Many bats find their way and catch insects in complete darkness using
echolocation. A bat produces short, high-pitched calls, usually too high for
people to hear, through its mouth or nose. When the sound waves hit an object,
such as a moth or a tree branch, they bounce back as echoes. By listening to how
long an echo takes to return and how it changes, the bat can judge the distance,
size and even the texture of the object. As a bat closes in on an insect, it
calls faster and faster, sometimes more than a hundred times per second, to track
its prey precisely. Some moths have evolved the ability to hear bat calls and
drop to the ground to escape.""",
     ["Why does a bat call faster as it gets closer to an insect?",
      "How have some moths adapted to hunting bats?"]),
    ("Maple Court water shut-off notice", """
Residents of Maple Court are reminded that the water supply to the whole building
will be turned off on Wednesday, 9 am to 3 pm, while plumbers replace the main
valve in the basement. Please store some drinking water in advance and avoid
using washing machines or dishwashers on Tuesday night, as the pipes will be
drained early on Wednesday. The lifts will continue to work normally. After the
water is turned back on, taps may run brown for a minute or two; this is harmless
and will clear quickly. If the work is delayed, a notice will be posted in the
lobby. Questions can be directed to the building manager, Mr. Okafor, on the
number displayed next to the mailboxes.""",
     ["Why should residents avoid running the washing machine on Tuesday night?",
      "What does the notice say about brown water from the taps?"]),
    ("Salt from the sea", """
Sea salt has been produced in shallow coastal ponds for thousands of years.
Seawater is let into a series of large, flat pools, usually during spring and
summer when the weather is warm and windy. As the sun and wind evaporate the
water, the remaining brine becomes saltier and is moved from one pond to the
next. When the brine is concentrated enough, salt crystals begin to form on the
bottom of the final ponds. Workers then rake the crystals into piles and leave
them to drain and dry. Some ponds turn pink or red because tiny algae and
microbes that thrive in very salty water contain coloured pigments. A single hot
summer can produce thousands of tonnes of salt.""",
     ["Why do some salt ponds turn pink?",
      "In which seasons is seawater usually let into the ponds?"]),
    ("Restoring the Hollins River", """
For most of the twentieth century, a two-kilometre stretch of the Hollins River
ran through a straight concrete channel built to prevent floods. In 2019 the
county began a project to remove the concrete and restore the river's natural
bends. Workers reshaped the banks, planted more than 5,000 native trees and
shrubs, and placed large stones and logs in the water to create pools where fish
can rest. The wider, curving channel slows the water during storms and lets it
spread into meadows rather than rushing toward the town. Since the project ended,
surveys have recorded the return of trout and kingfishers, and a new footpath
along the river has become popular with walkers.""",
     ["Why were logs and stones placed in the river?",
      "How does the new channel help to protect the town from floods?"]),
    ("How a refrigerator works", """
A refrigerator does not create cold; it moves heat from inside the cabinet to the
room outside. It does this with a special fluid called a refrigerant that
circulates through a closed loop of pipes. Inside the fridge, the refrigerant
passes through coils at low pressure, where it evaporates and absorbs heat from
the food compartment. A compressor then squeezes the vapour, which raises its
temperature. The hot vapour flows through coils on the back or bottom of the
fridge, where it gives off heat to the room and condenses back into a liquid. The
liquid passes through a narrow valve that lowers its pressure, and the cycle
begins again. This is why the back of a fridge often feels warm.""",
     ["Why does the back of a fridge often feel warm?",
      "What does the compressor do to the refrigerant?"]),
    ("Summit Fitness Centre membership rules", """
Members of the Summit Fitness Centre can use the gym from 5 am to 11 pm on
weekdays and from 7 am to 9 pm at weekends. Group classes must be booked through
the app, and bookings open 48 hours before each class. Members who miss a booked
class without cancelling at least two hours in advance cannot book any classes
for the following three days. Towels are provided free of charge, but members
must bring their own padlock for the changing-room lockers. Guests may visit up
to twice a month for a fee of 8 dollars per visit and must be accompanied by a
member. Children under sixteen may use the pool but not the weight room.""",
     ["What happens if a member misses a booked class without cancelling?",
      "Can a fifteen-year-old use the weight room?",
      "How far in advance do class bookings open?"]),
    ("Research stations in Antarctica", """
Around seventy research stations operate in Antarctica, run by about thirty
countries. In summer, several thousand scientists and support staff live there,
but in winter the number drops to about one thousand, because storms, darkness
and extreme cold make travel almost impossible. Researchers study many subjects,
including the thickness of the ice sheet, ancient air bubbles trapped in ice
cores, penguin and seal populations, and the upper atmosphere. Ice cores drilled
from deep in the ice contain a record of Earth's climate going back hundreds of
thousands of years. Under the Antarctic Treaty, which came into force in 1961,
the continent is reserved for peaceful purposes and scientific cooperation.""",
     ["Why do fewer people stay in Antarctica during the winter?",
      "What can ice cores tell scientists?"]),
    ("How dogs were domesticated", """
Dogs were the first animals to be domesticated, long before farming began.
Genetic studies suggest that they descend from a population of ancient wolves
that lived alongside human hunter-gatherers, and the process likely started at
least fifteen thousand years ago. One common theory is that some wolves scavenged
near human camps, and the calmer, less fearful animals were more successful
there. Over many generations, these animals became more dependent on people and
more skilled at reading human gestures. Later, people deliberately bred dogs for
particular tasks such as herding, guarding and hunting, which produced the great
variety of breeds seen today.""",
     ["According to the passage, how did the domestication of dogs probably begin?",
      "Why are there so many different dog breeds today?"]),
    ("How cheese is made", """
Cheese is made by separating milk into solid curds and liquid whey. First, the
milk is warmed and a starter culture of bacteria is added. The bacteria turn some
of the milk sugar into lactic acid, which helps the milk thicken and adds flavour.
Next, an enzyme called rennet is stirred in, causing the milk proteins to clump
together into a soft gel. The gel is cut into small pieces, which releases whey,
and the curds are then drained, salted and pressed into moulds. Many cheeses are
then aged for weeks, months or even years in cool, humid rooms, where their
flavour and texture continue to develop. Soft cheeses are usually aged for a
shorter time than hard ones.""",
     ["What does rennet do?",
      "What is done with the curds after the whey is released?"]),
    ("Volunteering at the Greenfield Animal Shelter", """
The Greenfield Animal Shelter is looking for volunteers to help care for dogs and
cats waiting for new homes. Volunteers must be at least eighteen years old, or
sixteen if accompanied by a parent, and must attend a two-hour orientation
session held on the first Saturday of each month. After orientation, volunteers
choose regular shifts of three hours, either in the morning or the afternoon.
Tasks include walking dogs, cleaning kennels, socialising shy cats and helping at
adoption events. Volunteers are asked to commit to at least one shift per week
for three months. Anyone who would like to help but cannot work with animals can
join the fundraising team, which meets online each month.""",
     ["Can a sixteen-year-old volunteer at the shelter?",
      "How long is each volunteer shift?",
      "How can someone help if they cannot work with animals?"]),
    ("Lightning and thunder", """
Lightning is a giant spark of electricity that forms inside storm clouds. As ice
crystals and small hailstones collide in the strong currents of a thundercloud,
they exchange electric charge, and the top of the cloud usually becomes
positively charged while the bottom becomes negatively charged. When the
difference in charge becomes large enough, electricity jumps through the air,
either within the cloud or between the cloud and the ground. A lightning bolt
heats the air around it to around 30,000 degrees Celsius in a fraction of a
second. The air expands so rapidly that it creates a shock wave, which we hear as
thunder. Because light travels much faster than sound, we see the flash before we
hear the thunder.""",
     ["What causes the sound of thunder?",
      "Why do we see lightning before we hear the thunder?"]),
    ("The ancient Olympic Games", """
The ancient Olympic Games were held at Olympia in southern Greece, traditionally
from 776 BC, every four years in honour of the god Zeus. At first the festival
had only one event, a sprint of about 190 metres called the stadion. Over time,
longer races, wrestling, boxing, chariot racing and the pentathlon were added.
Only free Greek men could compete, and winners received a crown of olive leaves
rather than money, although their home cities often rewarded them richly. During
the games, a sacred truce allowed athletes and spectators to travel safely. The
games continued for more than a thousand years before ending in the late fourth
century AD. The modern Olympics began in Athens in 1896.""",
     ["What prize did winners at the ancient games receive?",
      "What was the only event at the earliest games?"]),
    ("Why the sea is salty", """
The sea is salty mainly because of rain and rivers. Rainwater is slightly acidic,
so as it falls on land and flows over rocks, it slowly dissolves small amounts of
minerals. Rivers carry these dissolved minerals, including sodium and chloride,
down to the sea. When seawater evaporates, the water leaves but the salts stay
behind, so over millions of years the ocean has built up a steady concentration
of salt. Hot vents and underwater volcanoes on the ocean floor also add minerals.
On average, about 3.5 percent of the weight of seawater is dissolved salt. Some
enclosed lakes, where water can leave only by evaporating, become far saltier
than the ocean.""",
     ["How do minerals from rocks reach the sea?",
      "Why do some enclosed lakes become saltier than the ocean?"]),
    ("The Hillcrest Farmers' Market moves", """
From the first Saturday in May, the Hillcrest Farmers' Market will move from the
church car park to Jubilee Square, about five minutes' walk away. The new
location has room for sixty stalls, twice as many as before, and offers covered
space in case of rain. Opening hours will stay the same, from 8 am to 1 pm every
Saturday. Stallholders will be able to unload their vans from 6:30 am using the
loading bay on Station Road. Shoppers who arrive by car can use the multi-storey
car park on Mill Lane, where the first two hours are free. The market committee
hopes the larger site will attract new producers, including a cheesemaker and a
flower grower.""",
     ["How many stalls did the old location have room for?",
      "Where can shoppers park, and how long is parking free?"]),
    ("How hot air balloons fly", """
A hot air balloon flies because hot air is lighter than the cooler air around it.
The balloon, called the envelope, is made of strong nylon fabric and is open at
the bottom. Beneath it hangs a basket carrying the pilot, passengers and a burner
fuelled by propane. When the pilot fires the burner, the air inside the envelope
heats up, becomes less dense and lifts the balloon. To descend, the pilot lets
the air cool or opens a vent at the top to release some hot air. Balloons have no
steering; the pilot changes height to find winds blowing in different
directions. The first crewed flight in a hot air balloon took place in Paris in
1783.""",
     ["How does the pilot make the balloon go down?",
      "How does the pilot control which direction the balloon travels?"]),
    ("Why leaves change colour", """
Leaves are green in spring and summer because they are full of chlorophyll, the
pigment plants use to capture sunlight. Leaves also contain yellow and orange
pigments, but the large amount of chlorophyll usually hides them. As days grow
shorter and cooler in autumn, many trees stop making chlorophyll and begin to
break down what remains, saving its nutrients for the following year. As the
green fades, the yellow and orange colours become visible. Some trees, such as
many maples, also produce new red pigments in autumn, especially when days are
sunny and nights are cool. Eventually a layer of cells forms at the base of each
leaf stalk, and the leaf falls.""",
     ["Why do yellow and orange colours appear in autumn?",
      "What weather helps trees produce red colours?"]),
    ("Port Ellis, from fishing village to resort", """
Port Ellis was a small fishing village until the 1880s, when a railway line
connected it to the city, two hours inland. City families soon began visiting for
the sea air, and within twenty years the village had a promenade, three hotels
and a pier with a concert hall at its end. Fishing continued, but tourism became
the main source of work. The pier was badly damaged by a storm in 1953 and was
rebuilt in shorter form five years later. In recent decades, the town has
attracted artists drawn by its light and low rents, and several former
fishermen's sheds near the harbour are now galleries and studios.""",
     ["What turned Port Ellis into a tourist town?",
      "What happened to the pier in 1953, and when was it rebuilt?"]),
]

SUMMARY_TEMPLATES = [
    "Summarize the following passage in two or three sentences.\n\n{p}",
    "Write a one-sentence summary of this text.\n\n{p}",
    "Read the text below and list its main points as three short bullet points.\n\n{p}",
    "Give a brief summary of the following passage for someone who has not read it.\n\n{p}",
    "Summarize this in no more than 40 words:\n\n{p}",
    "Here is a passage titled \"{title}\". Write a short summary of it.\n\n{p}",
    "Text:\n{p}\n\nSummarize the text above in plain, simple language.",
    "Condense the following paragraph into a short summary that keeps the key facts.\n\n{p}",
    "What are the most important points in this passage? Answer briefly.\n\n{p}",
    "Summarize the following for a busy reader in two sentences:\n\n{p}",
    "Write a headline and a one-sentence summary for this text.\n\n{p}",
]

CONTEXT_QA_TEMPLATES = [
    "Answer the question using only the information in the passage below.\n\nPassage: {p}\n\nQuestion: {q}",
    "Read the passage and answer the question.\n\n{p}\n\nQuestion: {q}",
    "{p}\n\nBased on the text above, answer this question: {q}",
    "Passage:\n{p}\n\nQuestion: {q}\nAnswer in one or two sentences.",
    "Use the passage to answer the question. If the passage does not contain the answer, say so.\n\nPassage: {p}\n\nQuestion: {q}",
    "Here is a short text titled \"{title}\":\n\n{p}\n\n{q}",
    "Context: {p}\n\nQ: {q}\nA:",
    "{q}\n\nAnswer using this text:\n{p}",
]

# ---------------------------------------------------------------------------
# multi_turn: (system or None, first user turn, assistant reply, [follow-ups])
# ---------------------------------------------------------------------------
CONVERSATIONS = [
    (None, "How can I keep my houseplants alive while I'm on holiday for two weeks?",
     "Water them thoroughly just before you leave and move them away from sunny windows so they dry out "
     "more slowly. You can group them together in a bathroom, where the air is more humid, or use "
     "self-watering spikes or a cotton wick running from a jar of water to each pot.",
     ["What if I have a cactus? Does it need any of this?",
      "Can you explain how the wick method works in more detail?",
      "I'll be away for a whole month instead. What would you change?"]),
    (None, "I want to start running. How far should I run at first?",
     "Start with short sessions that mix running and walking, for example one minute of running followed "
     "by two minutes of walking, repeated for about twenty minutes. Do this three times a week and gradually "
     "increase the running time as it becomes easier.",
     ["How do I know if I'm going too fast?",
      "What should I eat before a morning run?",
      "My knees feel sore after running. What should I do?"]),
    (None, "What is a budget and why should I make one?",
     "A budget is a plan for how you will spend and save your money over a period, usually a month. It "
     "helps you see where your money goes, avoid spending more than you earn, and set aside money for goals "
     "or emergencies.",
     ["Can you show me a simple way to make my first monthly budget?",
      "What is an emergency fund and how big should it be?",
      "Which expenses do people most often forget to include?"]),
    (None, "Can you recommend a few classic novels for someone who doesn't read much?",
     "Some approachable classics are 'Of Mice and Men' by John Steinbeck, which is short and moving; 'The "
     "Old Man and the Sea' by Ernest Hemingway; and 'Animal Farm' by George Orwell, a short fable about "
     "power. All three can be read in a few evenings.",
     ["Which of those would you start with, and why?",
      "Can you suggest something similar but written more recently?"]),
    (None, "How do I make a good cup of coffee with a French press?",
     "Use coarsely ground coffee, about one tablespoon for every 100 millilitres of water. Pour in water "
     "just off the boil, stir gently, put the lid on and wait four minutes. Then press the plunger down "
     "slowly and pour the coffee straight away so it doesn't become bitter.",
     ["What happens if I use finely ground coffee instead?",
      "How should I clean the French press afterwards?"]),
    (None, "What's the best way to learn new vocabulary in a foreign language?",
     "Learn words in context rather than in isolated lists, review them at increasing intervals with "
     "flashcards, and try to use new words in your own sentences soon after learning them. Reading and "
     "listening to material you enjoy also helps words stick.",
     ["What does reviewing at increasing intervals mean exactly?",
      "How many new words should I try to learn each day?"]),
    (None, "My laptop has become really slow. What can I check first?",
     "First, restart it, since that clears many temporary problems. Then check how much free storage space "
     "you have, because a nearly full drive slows things down. Look at which programs start automatically "
     "and which ones use the most memory, and close or remove the ones you don't need.",
     ["How do I find out which programs use the most memory on Windows?",
      "Would adding more memory help?"]),
    (None, "Why do cats purr?",
     "Cats often purr when they are relaxed and content, for example while being stroked. But they also "
     "purr when they are stressed or hurt, so scientists think purring may also help them calm themselves. "
     "Kittens purr to let their mother know they are fine while feeding.",
     ["Do big cats like lions purr too?",
      "How can I tell whether my cat is purring because it is happy or because it is unwell?",
      "While we're at it, why does my cat knead blankets with its paws?"]),
    (None, "I have a job interview next week. How should I prepare?",
     "Research the company and the role, and think about how your experience matches what they need. "
     "Prepare short examples from past work that show your skills, practise answering common questions out "
     "loud, and plan a couple of questions to ask the interviewer. Also check the route so you arrive a "
     "little early.",
     ["What are some good questions to ask the interviewer at the end?",
      "How should I answer if they ask about my biggest weakness?",
      "What should I wear to an interview for an office job?"]),
    (None, "What are some easy vegetables to grow on a balcony?",
     "Cherry tomatoes, lettuce, radishes, spinach and herbs such as basil, mint and parsley grow well in "
     "containers. Choose pots with drainage holes, use good potting compost and place them where they get at "
     "least five or six hours of sunlight a day.",
     ["My balcony only gets sun in the morning. Which of those would still work?",
      "How often should I water them in summer?"]),
    (None, "Can you explain what a password manager is?",
     "A password manager is a program that stores your passwords in an encrypted vault, protected by one "
     "strong master password. It can generate long, random passwords for each website and fill them in "
     "automatically, so you don't have to remember them or reuse the same password everywhere.",
     ["Is it safe to keep all my passwords in one place?",
      "What happens if I forget my master password?"]),
    (None, "I'm planning a trip to the mountains in summer. What should I pack?",
     "Bring layers, because mountain weather changes quickly: a light base layer, a warm fleece and a "
     "waterproof jacket. Add comfortable walking boots, a hat, sunscreen and sunglasses, a refillable water "
     "bottle, snacks, a small first-aid kit and a map of the area.",
     ["Why is sunscreen important even if it's cold up there?",
      "How much water should I carry for a six-hour hike?"]),
    (None, "How do I get my toddler to eat more vegetables?",
     "Offer small amounts of vegetables often, alongside foods your child already likes, without pressure. "
     "Children may need to see and taste a new food many times before accepting it. Eating vegetables "
     "yourself and letting them help with cooking can also help.",
     ["She refuses anything green. Any ideas for that?",
      "Is it okay to hide vegetables in sauces?"]),
    (None, "What is the difference between a virus and a bacterium?",
     "Bacteria are single-celled living organisms that can reproduce on their own, and many are harmless or "
     "even helpful. Viruses are much smaller and are not cells at all; they can only multiply by entering the "
     "cells of another organism and using them to make copies of themselves.",
     ["Why don't antibiotics work against viruses?",
      "Can you give examples of illnesses caused by each?",
      "Where do vaccines fit into this?"]),
    (None, "I keep procrastinating on my studies. Any tips?",
     "Break your work into small, specific tasks so it is easy to start. Try working in focused blocks, such "
     "as 25 minutes followed by a short break, and put your phone in another room while you work. Rewarding "
     "yourself after finishing a task can also help build the habit.",
     ["What should I do during the short breaks?",
      "How do I stay motivated when the exam is still months away?"]),
    (None, "How do I write a good opening sentence for a story?",
     "A strong opening sentence makes the reader curious. You can start in the middle of an action, "
     "introduce an unusual detail, or give the narrator a distinctive voice. Avoid long descriptions of "
     "background at the start; save those for later, once the reader is interested.",
     ["Can you give me three example opening sentences for a mystery story?",
      "Now write one that opens with a line of dialogue."]),
    (None, "How does compound interest work?",
     "With compound interest, you earn interest not only on the money you originally saved but also on the "
     "interest you have already earned. For example, if you save 100 dollars at 5 percent a year, you have "
     "105 dollars after one year, and in the second year you earn 5 percent on 105 dollars rather than 100.",
     ["How much would I have after three years in that example?",
      "Why do people say it's good to start saving early?",
      "So what is simple interest, and how is it different?"]),
    (None, "My dog pulls on the lead during walks. What can I do?",
     "Stop walking whenever the lead becomes tight, and only continue when it goes slack again. Reward your "
     "dog with a treat or praise when it walks beside you. Keep training sessions short and consistent, and "
     "make sure your dog gets enough exercise and play so it has less excess energy on walks.",
     ["How long does this kind of training usually take?",
      "Would a harness help?"]),
    (None, "What should I do if I find a baby bird on the ground?",
     "If the bird has feathers and is hopping around, it is probably a fledgling learning to fly, and its "
     "parents are usually nearby; it's best to leave it alone and keep pets away. If it has few or no "
     "feathers, it may have fallen from its nest, and you can gently place it back if you can find the nest.",
     ["What if I can't find the nest?",
      "Is it true that the parents will reject it if I touch it?"]),
    (None, "How do I make my small living room look bigger?",
     "Use light colours on the walls, add a large mirror opposite a window to reflect light, and choose "
     "furniture with visible legs so more of the floor can be seen. Keep the space uncluttered and hang "
     "curtains from near the ceiling to make the room feel taller.",
     ["What kind of lighting would you recommend?",
      "I have a big dark sofa. Should I replace it?"]),
    (None, "Can you explain what a haiku is?",
     "A haiku is a short form of poetry from Japan. In English it is usually written in three lines with "
     "five, seven and five syllables. Traditional haiku focus on a moment in nature and often include a word "
     "that hints at the season.",
     ["Write a haiku about a rainy morning in the city.",
      "Now write one about the sea, following the same pattern."]),
    (None, "What's a healthy breakfast I can prepare quickly?",
     "Overnight oats are a good option: mix rolled oats with milk or yogurt in a jar the night before, and in "
     "the morning add fruit, nuts or a spoonful of honey. Other quick choices include wholegrain toast with "
     "eggs, or yogurt with berries and seeds.",
     ["How long do overnight oats keep in the fridge?",
      "Can you suggest a version without dairy?"]),
    (None, "I'd like to start a podcast. What equipment do I need?",
     "To begin, you only need a decent USB microphone, a pair of headphones and a quiet room. Free recording "
     "and editing software is enough for most beginners. As you grow, you can upgrade to an audio interface "
     "and a studio microphone.",
     ["How can I reduce the echo in my room?",
      "How long should a typical episode be?"]),
    (None, "Why is the sky blue?",
     "Sunlight contains all colours, and as it passes through the atmosphere, the tiny gas molecules scatter "
     "shorter wavelengths, like blue, much more than longer ones, like red. This scattered blue light reaches "
     "our eyes from every direction, so the sky looks blue.",
     ["Then why are sunsets red and orange?",
      "Would the sky look blue on Mars too?",
      "What colour would the sky be if Earth had no atmosphere?"]),
    (None, "How should I store fresh herbs so they last longer?",
     "Soft herbs such as parsley and coriander can be kept like flowers: trim the stems and stand them in a "
     "glass of water, loosely covered with a bag, in the fridge. Basil prefers a glass of water at room "
     "temperature. Hard herbs such as rosemary and thyme keep well wrapped in a slightly damp paper towel in "
     "the fridge.",
     ["Can I freeze herbs?",
      "How can I tell when herbs have gone bad?"]),
    (None, "What does a project manager do?",
     "A project manager plans and organises a project so that it is completed on time, within budget and to "
     "the expected standard. They define the goals, break the work into tasks, coordinate the team, track "
     "progress, manage risks and keep everyone informed.",
     ["What skills are most important for the job?",
      "How could someone with a teaching background move into project management?"]),
    (None, "How can I save energy at home in winter?",
     "Keep the heating a degree or two lower and wear warmer clothes indoors. Close curtains at night to hold "
     "in heat, block draughts around doors and windows, and only heat the rooms you use. Turning off lights "
     "and devices you aren't using also helps.",
     ["How can I find out where the draughts are coming from?",
      "Is it cheaper to leave the heating on low all day or to turn it on only when needed?"]),
    (None, "What is the difference between an asteroid, a meteor and a meteorite?",
     "An asteroid is a rocky object orbiting the Sun, mostly found in the belt between Mars and Jupiter. A "
     "meteor is the streak of light we see when a small piece of rock or dust burns up in Earth's atmosphere. "
     "If a piece survives and lands on the ground, it is called a meteorite.",
     ["What is a comet, then?",
      "How often do meteorites hit the Earth?"]),
    ("You are a patient maths tutor for a 12-year-old.",
     "I don't understand how to add fractions with different denominators.",
     "To add fractions with different denominators, first find a common denominator, a number that both "
     "denominators divide into. Then rewrite each fraction with that denominator and add the numerators. For "
     "example, 1/3 + 1/4 becomes 4/12 + 3/12, which equals 7/12.",
     ["Can you show me how to do 2/5 + 1/6?",
      "How do I find the common denominator quickly?"]),
    ("You are a helpful travel assistant.",
     "I have one day in Rome. What should I see?",
     "With one day, start early at the Colosseum and the Roman Forum, which are next to each other. After "
     "lunch, walk to the Pantheon and the Trevi Fountain, then finish at Piazza Navona in the evening. If "
     "you'd rather see the Vatican, book museum tickets in advance and visit St Peter's Basilica in the "
     "afternoon.",
     ["Which of these should I book in advance?",
      "What is a typical Roman dish I should try for lunch?"]),
    (None, "What's the difference between baking soda and baking powder?",
     "Baking soda is pure sodium bicarbonate and needs an acid, such as yogurt, lemon juice or buttermilk, to "
     "make a recipe rise. Baking powder contains baking soda plus a dry acid, so it only needs moisture and "
     "heat to work.",
     ["Can I use baking powder instead of baking soda in a recipe?",
      "Why do some recipes use both?"]),
    (None, "How do I politely decline an invitation to a party?",
     "Thank the person for inviting you, say clearly that you can't make it, and keep your reason short, for "
     "example: 'Thank you so much for the invitation! Unfortunately I can't come that evening, but I hope you "
     "have a wonderful time.' You don't need to give a detailed excuse.",
     ["Can you make it sound a bit warmer, for a close friend?",
      "How would I write it for a work colleague's retirement party?"]),
]

SYSTEM_PROMPTS = [
    "You are a helpful assistant.",
    "You are a friendly and concise assistant.",
    "You are a knowledgeable assistant who gives practical advice.",
    "Answer clearly and briefly.",
]

# ---------------------------------------------------------------------------
# translation
# ---------------------------------------------------------------------------
LANGUAGES = ["French", "Spanish", "German", "Italian"]
TRANSLATION_SENTENCES = [
    "The museum is closed on Mondays.",
    "Could you tell me how much this jacket costs?",
    "I have been learning to swim since last summer.",
    "Our train was delayed by twenty minutes because of the snow.",
    "Please remember to turn off the lights when you leave the room.",
    "My grandmother grows tomatoes and beans in her garden.",
    "We would like a table for four people near the window.",
    "The meeting has been moved to Thursday afternoon.",
    "It is going to be very hot tomorrow, so drink plenty of water.",
    "Where can I find a pharmacy that is open on Sunday?",
    "She has lived in this city for ten years.",
    "The children are playing football in the park.",
    "I forgot my umbrella at the office.",
    "How long does it take to walk to the old town?",
    "This soup is delicious; can I have the recipe?",
    "My phone battery is almost empty.",
    "The concert starts at eight o'clock, but the doors open at seven.",
    "I would like to book a room for two nights.",
    "He drinks a cup of tea every morning before work.",
    "The bakery on the corner sells fresh bread every day.",
    "Can you speak more slowly, please?",
    "We visited the castle and then had lunch by the river.",
    "My sister is a nurse at the city hospital.",
    "The shop will be closed for the holidays.",
    "I am looking for a gift for my father's birthday.",
    "The cat is sleeping on the sofa.",
    "Please send me the documents by Friday.",
    "It is the first time I have visited this country.",
    "The bus to the airport leaves every half hour.",
    "Do you know a good restaurant nearby?",
    "I need to buy milk, eggs and bread.",
    "Our neighbours have a small white dog.",
    "The film was long, but very interesting.",
    "I usually go to bed at eleven o'clock.",
    "Could you help me carry this suitcase?",
    "They are planning to move to the countryside next year.",
    "The key is under the flowerpot by the door.",
    "I am allergic to nuts.",
    "The weather was perfect for a walk in the hills.",
    "Thank you for your help; I really appreciate it.",
    "My favourite season is spring because everything turns green.",
    "The teacher asked the students to read the first chapter.",
    "Turn left at the traffic lights and the hotel is on your right.",
    "We ran out of coffee, so I will buy some more this afternoon.",
    "Is breakfast included in the price?",
    "The river flows through the centre of the town.",
    "I lost my wallet. Have you seen it anywhere?",
    "Every Saturday we have dinner with my parents.",
    "The new library has a large reading room and a small cafe.",
    "He missed the bus, so he arrived late at school.",
    "Happy birthday! I hope all your wishes come true.",
    "How much does a return ticket to the coast cost?",
]
TRANSLATION_TEMPLATES = [
    "Translate into {lang}: \"{s}\"",
    "Translate the following sentence into {lang}:\n\n{s}",
    "How would you say this in {lang}? \"{s}\"",
    "Please translate this English sentence to {lang}: \"{s}\"",
    "Translate to {lang}, keeping the tone natural: \"{s}\"",
    "Give the {lang} translation of: \"{s}\"",
    "What is \"{s}\" in {lang}?",
    "English: {s}\n{lang}:",
]

# ---------------------------------------------------------------------------
# qa: short factual questions
# ---------------------------------------------------------------------------
QA_QUESTIONS = [
    "What is the boiling point of water at sea level in degrees Celsius?",
    "Who painted the Mona Lisa?",
    "What is the chemical symbol for gold?",
    "How many days are there in a leap year?",
    "What is the longest river in Africa?",
    "Which planet is known as the Red Planet?",
    "Who was the first person to walk on the Moon?",
    "What is the capital city of Japan?",
    "How many legs does a spider have?",
    "What is the hardest natural substance on Earth?",
    "In which country are the pyramids of Giza?",
    "What is the freezing point of water in degrees Fahrenheit?",
    "Who developed the theory of relativity?",
    "What is the smallest prime number?",
    "What language is mainly spoken in Brazil?",
    "How many sides does a hexagon have?",
    "What is the main ingredient in guacamole?",
    "Which organ pumps blood through the human body?",
    "What is the tallest mountain in the world?",
    "Who wrote the novel Pride and Prejudice?",
    "What is the largest ocean on Earth?",
    "What is the currency of the United Kingdom?",
    "How many bones are there in the adult human body?",
    "What is the fastest land animal?",
    "In what year did the Second World War end?",
    "Which musical instrument usually has 88 keys?",
    "Who discovered penicillin?",
    "What is the capital of Australia?",
    "Which gas makes up most of Earth's atmosphere?",
    "How many minutes are there in a day?",
    "What is the square root of 144?",
    "Who is usually credited with inventing the telephone?",
    "What is the largest mammal on Earth?",
    "Which is the largest country in the world by area?",
    "How many players does a football (soccer) team have on the field at one time?",
    "What is the name of the galaxy that contains our solar system?",
    "What is the capital of Canada?",
    "Which metal is liquid at room temperature?",
    "How long does it take Earth to rotate once on its axis?",
    "What is the longest bone in the human body?",
    "Which scientist described the three laws of motion?",
    "What is the largest island in the world?",
    "Which ocean lies between Africa and Australia?",
    "What does a barometer measure?",
    "What is the closest star to Earth?",
    "How many strings does a standard violin have?",
    "What is the chemical formula of table salt?",
    "Which city is nicknamed the Big Apple?",
    "Which type of blood cell helps the body fight infection?",
    "About how long does light from the Sun take to reach Earth?",
    "Which country gave the Statue of Liberty to the United States?",
    "What is the largest organ of the human body?",
    "What is the capital of Egypt?",
    "What is a baby kangaroo called?",
    "Which planet is famous for its large, bright rings?",
    "How many teeth does an adult human usually have?",
    "What is the unit of electrical resistance?",
    "Who is traditionally said to have written the Odyssey?",
    "What is the highest waterfall in the world?",
    "On which continent is the Amazon rainforest?",
    "What is the capital of Kenya?",
    "Which vitamin does the skin make when exposed to sunlight?",
    "Who was the first woman to win a Nobel Prize?",
    "What is the largest bird that cannot fly?",
    "In what year did the Titanic sink?",
    "Which element has the atomic number 1?",
    "What is the capital of Spain?",
    "Why do we have leap years?",
    "What is the main language spoken in Mexico?",
    "How many degrees are there in a right angle?",
    "Which planet is closest to the Sun?",
    "What do caterpillars turn into?",
    "Who wrote the fairy tale The Little Mermaid?",
    "What is the deepest part of the world's oceans called?",
    "What is the plural of the word 'mouse'?",
    "How many weeks are there in a year?",
    "Which country is home to the kangaroo and the koala?",
    "What is the primary source of energy for Earth's climate?",
]
QA_SUFFIXES = [
    "",
    " Answer in one sentence.",
    " Give a short answer and one interesting related fact.",
    " Please explain briefly.",
]

# ---------------------------------------------------------------------------
# math: grade-school word problems; numbers come from the RNG, and every
# generator keeps the answer a whole, sensible number (no negative change,
# exact division where the story needs it).
# ---------------------------------------------------------------------------
PEOPLE = [("Maya", "she", "her"), ("Liam", "he", "his"), ("Aisha", "she", "her"), ("Noah", "he", "his"),
          ("Sofia", "she", "her"), ("Kenji", "he", "his"), ("Elena", "she", "her"), ("Omar", "he", "his"),
          ("Grace", "she", "her"), ("Lucas", "he", "his"), ("Priya", "she", "her"), ("Daniel", "he", "his")]
STEP_SUFFIXES = [
    "Let's think step by step.",
    "Reason step by step.",
    "Solve it step by step and give the final answer.",
    "Reason step by step, then state the final answer on its own line.",
    "Show your reasoning step by step.",
    "Explain your reasoning step by step.",
]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def money(x: float) -> str:
    return f"${x:.0f}" if float(x).is_integer() else f"${x:.2f}"


def m_change(r):
    name, she, _ = r.choice(PEOPLE)
    item, price = r.choice([("notebooks", r.choice([2, 3, 4, 5])), ("sandwiches", r.choice([4.5, 5, 6.5])),
                            ("comic books", r.choice([3, 4, 6])), ("bottles of juice", r.choice([1.5, 2, 2.5]))])
    n = r.randint(2, 6)
    bill = next(b for b in (10, 20, 50, 100) if b > n * price)
    return (f"{name} buys {n} {item} that cost {money(price)} each. {she.capitalize()} pays with a "
            f"{money(bill)} bill. How much change does {she} get?")


def m_distance(r):
    v1, t1, v2, t2 = r.choice([40, 50, 60, 80]), r.randint(2, 4), r.choice([30, 45, 70, 90]), r.randint(1, 3)
    return (f"A car travels at {v1} km per hour for {t1} hours and then at {v2} km per hour for {t2} more "
            f"hour{'s' if t2 > 1 else ''}. How far does it travel in total?")


def m_share(r):
    name, she, _ = r.choice(PEOPLE)
    k, each, keep = r.randint(3, 6), r.randint(4, 12), r.randint(2, 9)
    self_ = "herself" if she == "she" else "himself"
    return (f"{name} has {k * each + keep} stickers. {she.capitalize()} keeps {keep} for {self_} and shares "
            f"the rest equally among {k} friends. How many stickers does each friend get?")


def m_ages(r):
    name, she, her = r.choice(PEOPLE)
    a, d, y = r.randint(6, 14), r.randint(2, 9), r.randint(3, 10)
    return (f"{name} is {a} years old. {her.capitalize()} cousin is {d} years older. In {y} years, what will "
            f"the sum of their ages be?")


def m_savings(r):
    name, she, _ = r.choice(PEOPLE)
    s, c = r.choice([5, 8, 10, 12, 15, 20]), r.choice([96, 120, 150, 185, 210, 240])
    have = r.choice([0, 10, 25, 30])
    start = f" {she.capitalize()} already has {money(have)}." if have else ""
    return (f"{name} wants to buy a bike that costs {money(c)}.{start} If {she} saves {money(s)} every week, "
            f"how many weeks will it take to have enough money?")


def m_garden(r):
    l, w = r.randint(6, 25), r.randint(3, 15)
    return (f"A rectangular garden is {l} metres long and {w} metres wide. What is its area, and how many "
            f"metres of fencing are needed to go all the way around it?")


def m_discount(r):
    item = r.choice(["jacket", "pair of shoes", "backpack", "lamp", "board game"])
    p, d = r.choice([40, 60, 80, 120, 150, 200]), r.choice([10, 20, 25, 50])
    return f"A {item} costs {money(p)}. It is on sale for {d}% off. What is the sale price?"


def m_recipe(r):
    s = r.choice([2, 4, 6])
    t = s * r.choice([2, 3]) if r.random() < 0.6 else s // 2 if s > 2 else s * 5
    g, e = r.choice([150, 200, 300, 240]), r.choice([2, 4])
    return (f"A recipe for {s} people uses {g} grams of flour and {e} eggs. How much flour and how many eggs "
            f"are needed to make it for {t} people?")


def m_clock(r):
    h, m, d = r.randint(1, 8), r.choice([0, 15, 20, 30, 45, 50]), r.choice([95, 110, 125, 140, 155])
    return f"A film starts at {h}:{m:02d} pm and lasts {d} minutes. At what time does it end?"


def m_pages(r):
    name, she, _ = r.choice(PEOPLE)
    p, q = r.randint(8, 25), r.randint(5, 30)
    return (f"{name} reads {p} pages on Monday, twice as many on Tuesday, and {q} pages on Wednesday. "
            f"How many pages does {she} read over the three days?")


def m_legs(r):
    c, w = r.randint(5, 30), r.randint(2, 12)
    other = r.choice([("cows", 4), ("sheep", 4), ("goats", 4)])
    return (f"A farmer has {c} chickens and {w} {other[0]}. How many legs do all the animals have "
            f"altogether?")


def m_boxes(r):
    b, n = r.randint(4, 12), r.choice([12, 18, 24, 30])
    s = r.randint(n, b * n - 5)
    fruit = r.choice(["apples", "oranges", "pears", "lemons"])
    return (f"A shop receives {b} boxes of {fruit} with {n} {fruit} in each box. During the day it sells {s} "
            f"{fruit}. How many {fruit} are left?")


def m_average(r):
    name, _, her = r.choice(PEOPLE)
    while True:
        xs = [r.randint(60, 99) for _ in range(4)]
        if sum(xs) % 4 == 0:
            break
    return f"{name}'s scores on four tests were {xs[0]}, {xs[1]}, {xs[2]} and {xs[3]}. What is {her} average score?"


def m_printer(r):
    copies = r.choice([5, 8, 10, 12, 20])
    pages = r.choice([6, 10, 12, 15, 20, 30])
    rate = r.choice([x for x in (10, 12, 15, 20, 25) if copies * pages % x == 0])  # whole minutes
    return (f"A printer prints {rate} pages per minute. How many minutes does it take to print {copies} "
            f"copies of a {pages}-page report?")


def m_coins(r):
    name, she, _ = r.choice(PEOPLE)
    q, d, n = r.randint(2, 12), r.randint(1, 10), r.randint(1, 9)
    return (f"{name} has {plural(q, 'quarter')}, {plural(d, 'dime')} and {plural(n, 'nickel')}. How much "
            f"money does {she} have in dollars and cents?")


def m_fuel(r):
    f, k = r.choice([6, 8, 25, 30]), r.choice([150, 250, 300, 450, 600])
    vehicle = "car" if f < 10 else "bus"
    return f"A {vehicle} uses {f} litres of fuel for every 100 km. How much fuel does it need for a trip of {k} km?"


def m_temperature(r):
    t, a, b = r.randint(-5, 12), r.randint(4, 15), r.randint(3, 18)
    return (f"In the morning the temperature was {t} degrees Celsius. By noon it had risen by {a} degrees, "
            f"and by midnight it had fallen by {b} degrees from the noon temperature. What was the "
            f"temperature at midnight?")


def m_tickets(r):
    a, c = r.choice([8, 10, 12, 15]), r.choice([4, 5, 6, 7.5])
    x, y = r.randint(1, 4), r.randint(1, 5)
    return (f"Tickets to a school play cost {money(a)} for adults and {money(c)} for children. A family "
            f"buys {x} adult tickets and {y} child tickets. How much do they pay altogether?")


def m_fraction(r):
    num, den = r.choice([(1, 4), (2, 5), (3, 4), (1, 3), (2, 3), (3, 5)])
    n = den * r.randint(6, 12)
    return (f"A class has {n} students. {num}/{den} of them walk to school and the rest come by bus. "
            f"How many students come by bus?")


def m_tank(r):
    cap = r.choice([200, 300, 400, 600, 800])
    pct = r.choice([25, 40, 50, 75])
    missing = cap * (100 - pct) // 100
    rate = r.choice([x for x in (10, 20, 25, 50) if missing % x == 0])  # whole minutes
    return (f"A water tank holds {cap} litres and is {pct}% full. A hose adds {rate} litres per minute. How "
            f"many minutes will it take to fill the tank completely?")


def m_wage(r):
    name, she, _ = r.choice(PEOPLE)
    w, h, days = r.choice([12, 14, 15, 18]), r.randint(3, 8), r.randint(3, 5)
    return (f"{name} earns {money(w)} per hour at a part-time job. {she.capitalize()} works {h} hours a day "
            f"for {days} days this week. How much does {she} earn this week?")


def m_trees(r):
    rows, per, dead = r.randint(4, 15), r.randint(6, 20), r.randint(1, 9)
    return (f"An orchard has {rows} rows of trees with {per} trees in each row. After a storm, {dead} trees "
            f"had to be removed. How many trees are left in the orchard?")


MATH_GENERATORS = [m_change, m_distance, m_share, m_ages, m_savings, m_garden, m_discount, m_recipe, m_clock,
                   m_pages, m_legs, m_boxes, m_average, m_printer, m_coins, m_fuel, m_temperature, m_tickets,
                   m_fraction, m_tank, m_wage, m_trees]

# ---------------------------------------------------------------------------
# code: write a function / fix a bug / explain a snippet
# ---------------------------------------------------------------------------
CODE_WRITE_SPECS = [
    "a function reverse_words(sentence) that returns the sentence with the order of its words reversed",
    "a function is_leap_year(year) that returns True if the year is a leap year in the Gregorian calendar",
    "a function celsius_to_fahrenheit(c) that converts a temperature from Celsius to Fahrenheit",
    "a function word_counts(text) that returns a dictionary mapping each word to how often it appears, ignoring case",
    "a function flatten(nested) that turns a list of lists into a single flat list",
    "a function is_prime(n) that returns True if n is a prime number",
    "a function gcd(a, b) that returns the greatest common divisor of two positive integers using Euclid's algorithm",
    "a function remove_duplicates(items) that removes duplicates from a list while keeping the original order",
    "a function merge_sorted(a, b) that merges two sorted lists into one sorted list without calling sort()",
    "a function chunk(items, size) that splits a list into consecutive pieces of the given size",
    "a function sum_digits(n) that returns the sum of the digits of a non-negative integer",
    "a function find_max(numbers) that returns the largest number in a list without using the built-in max()",
    "a function is_anagram(a, b) that checks whether two strings are anagrams, ignoring spaces and case",
    "a function running_total(numbers) that returns the list of cumulative sums",
    "a function average(numbers) that returns the mean of a list of numbers, or None for an empty list",
    "a function binary_search(items, target) that returns the index of target in a sorted list, or -1 if it is missing",
    "a function fizzbuzz(n) that returns a list of strings for 1 to n, using 'Fizz' for multiples of 3, 'Buzz' for "
    "multiples of 5 and 'FizzBuzz' for multiples of both",
    "a function read_lines(path) that reads a text file and returns its non-empty lines with surrounding whitespace removed",
    "a function looks_like_email(address) that does a simple check that a string contains one @ with a dot somewhere after it",
    "a function rotate_right(items, k) that rotates a list to the right by k positions",
    "a function most_common(items) that returns the most frequent element of a list",
    "a function to_snake_case(name) that converts a CamelCase name such as 'MyVariableName' to snake_case",
    "a function format_duration(seconds) that turns a number of seconds into a string like '01:05:09' (HH:MM:SS)",
    "a function transpose(matrix) that returns the transpose of a matrix given as a list of lists",
    "a function text_stats(text) that returns the number of lines, words and characters in a string",
    "a function caesar(text, shift) that shifts each letter by the given amount, wrapping around the alphabet and "
    "leaving other characters unchanged",
    "a function invert_dict(d) that swaps the keys and values of a dictionary",
    "a function clamp(value, low, high) that limits a number to the range from low to high",
    "a function longest_word(sentence) that returns the longest word in a sentence",
    "a function digits_to_words(n) that spells out each digit of a number, so 42 becomes 'four two'",
    "a function is_sorted(items) that returns True if a list is in non-decreasing order",
    "a function letter_grade(score) that returns A, B, C, D or F for a score from 0 to 100",
    "a class Stack with push, pop, peek and is_empty methods",
    "a function count_extensions(filenames) that counts how many file names have each extension, returning a dictionary",
    "a class BankAccount with deposit and withdraw methods and a balance attribute, where withdraw raises ValueError "
    "if there is not enough money",
    "a function pairs_with_sum(numbers, target) that returns all pairs of numbers in a list that add up to target",
    "a function count_uppercase(text) that returns how many uppercase letters a string contains",
    "a function dedupe_emails(emails) that removes duplicate email addresses, treating upper and lower case as the same",
    "a function days_between(date1, date2) that takes two dates as 'YYYY-MM-DD' strings and returns the number of "
    "days between them, using the datetime module",
    "a function histogram(numbers) that prints one line of asterisks for each number in a list",
]
CODE_WRITE_TEMPLATES = [
    "Write {spec} in Python.",
    "In Python, write {spec}. Include a short docstring and an example call.",
    "Implement {spec} in Python and briefly explain how it works.",
    "Using only the Python standard library, write {spec}. Keep the code short.",
]

# (what the function should do and what goes wrong, buggy code)
CODE_FIX = [
    ("should return the average of a list of numbers, but the result is too small",
     """
     def average(numbers):
         total = 0
         for i in range(1, len(numbers)):
             total += numbers[i]
         return total / len(numbers)
     """),
    ("should return the largest number in a list, but it returns 0 for [-5, -2, -9]",
     """
     def find_max(numbers):
         largest = 0
         for n in numbers:
             if n > largest:
                 largest = n
         return largest
     """),
    ("should check whether a number is even, but Python reports a SyntaxError",
     """
     def is_even(n):
         if n % 2 = 0:
             return True
         return False
     """),
    ("should reverse a string, but it returns the string unchanged",
     """
     def reverse_string(s):
         result = ""
         for ch in s:
             result = result + ch
         return result
     """),
    ("should return a new list holding just the given item when no list is passed, but the second call "
     "returns ['a', 'b'] instead of ['b']",
     """
     def add_item(item, items=[]):
         items.append(item)
         return items
     """),
    ("should return 1 + 2 + ... + n, but sum_to_n(3) returns 3 instead of 6",
     """
     def sum_to_n(n):
         total = 0
         for i in range(n):
             total += i
         return total
     """),
    ("should count how often each word appears, but it raises a KeyError",
     """
     def word_counts(text):
         counts = {}
         for word in text.lower().split():
             counts[word] += 1
         return counts
     """),
    ("should test whether n is prime, but it says that 9 is prime",
     """
     def is_prime(n):
         for i in range(2, n):
             if n % i == 0:
                 return False
             return True
     """),
    ("should convert Celsius to Fahrenheit, but it gives -32 for 0 degrees instead of 32",
     """
     def to_fahrenheit(celsius):
         return celsius * 9 / 5 - 32
     """),
    ("should return the last element of a list, but it raises an IndexError",
     """
     def last_item(items):
         return items[len(items)]
     """),
    ("should remove all negative numbers from a list, but for [-1, -2, 3] it returns [-2, 3]",
     """
     def remove_negatives(numbers):
         for n in numbers:
             if n < 0:
                 numbers.remove(n)
         return numbers
     """),
    ("should build a sentence describing a person, but it raises a TypeError when age is an integer",
     """
     def describe(name, age):
         return "My name is " + name + " and I am " + age + " years old."
     """),
    ("should count down from n to 1 and then print 'Lift off!', but it never finishes",
     """
     def countdown(n):
         while n > 0:
             print(n)
         print("Lift off!")
     """),
    ("should find the index of target in a sorted list, but for some inputs it loops forever",
     """
     def binary_search(items, target):
         low, high = 0, len(items)
         while low < high:
             mid = (low + high) // 2
             if items[mid] == target:
                 return mid
             elif items[mid] < target:
                 low = mid
             else:
                 high = mid
         return -1
     """),
    ("should capitalize every word in a string, but it returns the text unchanged",
     """
     def capitalize_words(text):
         words = text.split()
         for word in words:
             word = word.capitalize()
         return " ".join(words)
     """),
    ("should return a price including tax, but it always returns None",
     """
     def price_with_tax(price, rate):
         tax = price * rate / 100
         price + tax
     """),
    ("should return a new list with every number doubled, but it also changes the caller's original list",
     """
     def doubled(numbers):
         result = numbers
         for i in range(len(result)):
             result[i] = result[i] * 2
         return result
     """),
    ("should return what percentage part is of whole, but percentage(1, 4) returns 0 instead of 25.0",
     """
     def percentage(part, whole):
         return part // whole * 100
     """),
    ("should count the lines in a file, but it raises a TypeError",
     """
     def count_lines(path):
         f = open(path)
         lines = f.readlines
         f.close()
         return len(lines)
     """),
    ("should print Fizz, Buzz or FizzBuzz for the numbers 1 to n, but it never prints FizzBuzz",
     """
     def fizzbuzz(n):
         for i in range(1, n + 1):
             if i % 3 == 0:
                 print("Fizz")
             elif i % 5 == 0:
                 print("Buzz")
             elif i % 15 == 0:
                 print("FizzBuzz")
             else:
                 print(i)
     """),
    ("should return the smallest and the largest number in a list, but the second value is wrong",
     """
     def min_and_max(numbers):
         numbers.sort()
         return numbers[0], numbers[1]
     """),
    ("should decide whether someone is an adult from the age they typed in, but it raises a TypeError",
     """
     def is_adult():
         age = input("How old are you? ")
         return age >= 18
     """),
    ("should return the number of vowels and consonants in a word, but the consonant count includes spaces "
     "and punctuation",
     """
     def letter_counts(text):
         vowels = consonants = 0
         for ch in text.lower():
             if ch in "aeiou":
                 vowels += 1
             else:
                 consonants += 1
         return vowels, consonants
     """),
]
CODE_FIX_TEMPLATES = [
    "The following Python function {desc}. Find the bug and fix it.\n\n{code}",
    "This Python code {desc}. What is wrong, and how should it be fixed?\n\n{code}",
    "Fix the bug in this function. It {desc}.\n\n{code}",
]

CODE_EXPLAIN = [
    """
    squares = [n * n for n in range(10) if n % 2 == 0]
    print(squares)
    """,
    """
    with open("names.txt") as f:
        names = sorted(line.strip() for line in f if line.strip())
    print(names[:3])
    """,
    """
    for index, fruit in enumerate(["apple", "banana", "cherry"], start=1):
        print(index, fruit)
    """,
    """
    people = [("Ana", 31), ("Ben", 25), ("Chloe", 28)]
    people.sort(key=lambda p: p[1])
    print([name for name, age in people])
    """,
    """
    def safe_divide(a, b):
        try:
            return a / b
        except ZeroDivisionError:
            return None
    """,
    """
    from collections import Counter
    words = "the cat and the hat".split()
    print(Counter(words).most_common(1))
    """,
    """
    prices = {"tea": 2.5, "cake": 3.0, "soup": 4.25}
    cheap = {item: p for item, p in prices.items() if p < 3.5}
    print(cheap)
    """,
    """
    names = ["Ana", "Ben", "Chloe"]
    ages = [31, 25, 28]
    for name, age in zip(names, ages):
        print(f"{name} is {age} years old")
    """,
]
CODE_EXPLAIN_TEMPLATES = [
    "Explain what this Python code does, line by line.\n\n{code}",
    "What does the following Python code print, and why?\n\n{code}",
]

# ---------------------------------------------------------------------------
# explanation
# ---------------------------------------------------------------------------
EXPLANATION_TOPICS = [
    "how airplanes stay in the air", "why ice floats on water", "how the internet delivers a web page to your computer",
    "why the Moon seems to change shape during the month", "how muscles get stronger with exercise", "why bread rises",
    "how a battery stores and releases energy", "why metal feels colder than wood at the same temperature",
    "how GPS works out your location", "why people yawn", "how paper is recycled", "what causes inflation",
    "how a microwave oven heats food", "what causes ocean waves", "how the heart pumps blood around the body",
    "why some animals hibernate", "how a digital camera captures a photo", "how noise-cancelling headphones work",
    "why cutting onions makes people cry", "how elevators work", "why fingers get wrinkly in the bath",
    "how a search engine finds web pages", "what causes the northern lights", "how soap removes grease",
    "why the night sky is dark even though there are so many stars", "how plant roots know which way to grow",
    "how a credit score works", "why stars twinkle", "how a thermostat controls the heating",
    "what happens in the body when you sneeze", "how birds find their way on long migrations",
    "why people get goosebumps", "why a fire needs oxygen to keep burning", "how wind turbines generate electricity",
    "why cities are often warmer than the countryside", "how a touch screen detects your finger",
    "what makes popcorn pop", "how a pin tumbler lock and key work", "why salt is spread on icy roads",
    "how the ear turns sound into something the brain understands", "how interest on a loan works",
    "how a ship made of steel can float", "why iron rusts", "how honeybees use a dance to share directions",
    "why Earth has seasons", "how a seed grows into a plant", "how echoes are formed", "what a black hole is",
    "how the stock market works", "how a QR code stores information", "how computers store numbers in binary",
    "why regular exercise can improve your mood", "why the Dead Sea makes swimmers float",
    "how a pressure cooker cooks food faster", "why we have time zones",
]
EXPLANATION_TEMPLATES = [
    "Explain {t}.",
    "Can you explain {t} in simple terms?",
    "Explain {t} to a ten-year-old.",
    "Give a clear, short explanation of {t}.",
    "In one short paragraph, explain {t}.",
    "I've always wondered about this. Please explain {t}, with an everyday example.",
]

# ---------------------------------------------------------------------------
# list
# ---------------------------------------------------------------------------
LIST_SUBJECTS = [
    "ways to reduce plastic waste at home", "tips for studying more effectively", "healthy snacks for children",
    "countries in South America and their capitals", "indoor activities for a rainy day",
    "questions to ask when buying a used car", "ways to make friends after moving to a new city",
    "common mistakes beginners make when learning to code", "items to pack for a beach holiday",
    "benefits of walking every day", "fruits that are rich in vitamin C", "famous inventors and what they invented",
    "ideas for an eight-year-old's birthday party", "ways to save money on groceries",
    "things to check before a long car journey", "hobbies that can be done at home",
    "signs that a houseplant needs more light", "safety tips for cycling in a city",
    "ways to stay productive when working from home", "animals that live in the Arctic",
    "household uses for baking soda", "board games that families can play together",
    "habits for a healthy morning routine", "tips for writing a clear email", "reasons to learn a second language",
    "vegetables that grow well in cool weather", "ways to reduce stress before an exam",
    "skills that are useful in almost any job", "questions to ask at a parent-teacher meeting",
    "ideas for a simple vegetarian dinner", "ways to keep a kitchen clean and organised",
    "things to look for in a good pair of running shoes", "ways to welcome a new employee to a team",
    "tips for taking better photos with a phone", "classic books for teenagers", "ways to save water in the garden",
    "items for a basic first-aid kit", "things to consider before adopting a pet",
    "tips for giving a confident presentation", "ways to use leftover rice", "common English idioms and their meanings",
    "inexpensive date ideas", "warning signs of a phishing email", "science project ideas for middle school students",
    "ways to keep warm while camping", "famous landmarks in Europe", "ways to improve your handwriting",
    "musical instruments from around the world",
]
LIST_TEMPLATES = [
    "List {n} {s}.",
    "Give me a list of {n} {s}.",
    "What are {n} {s}? Give a numbered list.",
    "Make a bulleted list of {n} {s}, with one short sentence for each.",
    "Name {n} {s}.",
]
LIST_SIZES = [3, 4, 5, 6, 7, 8, 10]

# ---------------------------------------------------------------------------
# how_to
# ---------------------------------------------------------------------------
HOW_TO_TASKS = [
    "change a flat tyre on a car", "make a simple tomato sauce", "tie a necktie", "plant a young tree",
    "set up a new email account", "remove a coffee stain from a cotton shirt", "fold a paper airplane that flies well",
    "write a cover letter", "clean a laptop keyboard", "boil an egg so the yolk stays soft",
    "hang a picture frame so it is straight", "start a compost heap", "back up the photos on my phone",
    "unclog a kitchen sink without chemicals", "make a monthly budget in a spreadsheet", "teach a puppy to sit",
    "brew green tea properly", "sew a button back onto a shirt", "create a strong password I can remember",
    "fold a fitted sheet", "bake bread at home without a bread machine", "wash a wool sweater by hand",
    "paint a room", "prepare a garden bed for spring planting", "jump-start a car with a flat battery",
    "make hot chocolate from scratch", "introduce myself at a networking event", "organise a small wardrobe",
    "look after a cast-iron pan", "make a simple web page with HTML", "measure my pulse by hand",
    "change a light bulb safely", "prepare for a job interview over video call", "build a campfire safely",
    "make homemade lemonade", "set up a small freshwater aquarium", "keep cut flowers fresh for longer",
    "replace the inner tube of a bicycle tyre", "write a thank-you note", "defrost a freezer",
    "make a simple vegetable soup", "learn to juggle three balls", "iron a dress shirt", "pack a suitcase efficiently",
    "make a to-do list that actually works", "clean a mirror without streaks", "repot a houseplant",
    "get rid of fruit flies in the kitchen",
]
HOW_TO_TEMPLATES = [
    "How do I {t}?",
    "Explain step by step how to {t}.",
    "Give me simple instructions to {t}.",
    "What is the easiest way to {t}? List the steps.",
    "I've never done this before. How can I {t}?",
]

# ---------------------------------------------------------------------------
# creative
# ---------------------------------------------------------------------------
CREATIVE_SUBJECTS = [
    "a lighthouse keeper who finds a message in a bottle", "a robot learning to paint",
    "a lost kitten finding its way home", "the first warm day of spring", "a city at night",
    "a child who can talk to trees", "an old clock that stops at midnight", "a dragon who is afraid of fire",
    "a train journey through the mountains", "the ocean at sunrise", "a grandmother's kitchen",
    "the friendship between a fox and a crow", "a snowy village", "a singer who loses her voice before a big concert",
    "a garden that grows overnight", "a detective who solves cases by smell", "a library where the books whisper",
    "the last leaf on a tree", "an astronaut looking back at Earth", "a rainy Sunday afternoon",
    "a baker who bakes dreams into bread", "a forgotten toy in an attic", "the moon getting lost",
    "a small boat in a big storm", "a squirrel preparing for winter", "a village summer festival",
    "a talking umbrella", "a boy who collects clouds", "the smell of fresh coffee in the morning",
    "a cat who thinks she is a queen", "a message from the future", "a mountain that wants to travel",
    "two strangers sharing an umbrella", "a tiny island with a single tree", "a firefly who is afraid of the dark",
    "an inventor whose machines never work", "the sound of rain on a tin roof", "a key that opens any door",
    "a penguin who wants to fly", "a quiet morning in the forest", "a street market at dawn",
    "a letter that arrives fifty years late", "a star that falls into a pond", "a shy giant",
    "a bus driver's last day before retiring",
]
CREATIVE_TEMPLATES = [
    "Write a short story about {s}.",
    "Write a poem about {s}.",
    "Write a haiku about {s}.",
    "Write a limerick about {s}.",
    "Write a four-line rhyming poem about {s}.",
    "Write the opening paragraph of a story about {s}.",
    "Write a very short story (under 150 words) about {s}.",
    "Write a bedtime story for a young child about {s}.",
    "Write a short story about {s}, told in the first person.",
]

# ---------------------------------------------------------------------------
# email
# ---------------------------------------------------------------------------
EMAIL_SITUATIONS = [
    "to your manager asking for next Friday off to attend a family event",
    "to your landlord reporting that the heating in your flat has stopped working",
    "to a customer apologising for a delayed order",
    "to a colleague thanking them for their help on a project",
    "to your child's teacher explaining that your child was absent yesterday because of a cold",
    "to a hotel asking whether early check-in is possible",
    "to your team announcing a new time for the weekly meeting",
    "to an online shop requesting a refund for a damaged product",
    "to a friend inviting them to a barbecue next weekend",
    "to a professor asking for a one-week extension on an essay",
    "to a job applicant inviting them to an interview",
    "to a client politely following up on an unpaid invoice",
    "to your neighbours about a street clean-up day",
    "to a supplier asking for a price quote for 500 notebooks",
    "to a former manager asking if they would be a reference for you",
    "to a gym cancelling your membership",
    "to a restaurant booking a table for ten people for a birthday dinner",
    "to a customer confirming their appointment next Tuesday at 3 pm",
    "to your team sharing the good results of a product launch",
    "to a recruiter politely declining a job offer",
    "to a conference organiser asking about vegetarian meal options",
    "to the IT help desk reporting that you cannot log in to your account",
    "to a new employee welcoming them to the company",
    "to volunteers thanking them after a charity fun run",
    "to a school asking about enrolment for next year",
    "to your bank reporting a lost debit card",
    "to a plumber asking them to come and fix a leaking pipe",
    "to your manager summarising what you worked on this week",
    "to a client proposing a new time for a meeting",
    "to members of a book club announcing next month's book",
    "to customers explaining a change in the shop's opening hours",
    "to a colleague asking them to review a document by Thursday",
    "to a travel agency asking to change the dates of a booking",
    "to an author telling them how much you enjoyed their latest book",
    "to parents about a class trip to the science museum",
    "to the local council about a broken streetlight on your road",
    "to a coworker who is leaving the company, wishing them well",
    "to a tenant reminding them that rent is due on Friday",
    "to a customer thanking them for their first order",
]
EMAIL_TEMPLATES = [
    "Write an email {s}.",
    "Write a short, polite email {s}.",
    "Draft a professional email {s}.",
    "Write a friendly email {s}. Keep it under 120 words.",
    "Compose an email {s}. Include a subject line.",
]

# ---------------------------------------------------------------------------
# classification
# ---------------------------------------------------------------------------
REVIEWS = [
    "The headphones sound great and the battery lasts all week. Best purchase I've made this year.",
    "The delivery was two weeks late and the box arrived crushed. I won't order from this shop again.",
    "The hotel room was clean, but the walls were thin and we could hear every conversation next door.",
    "It does what it says. Nothing special, but it works.",
    "I was sceptical at first, but this blender has completely changed my mornings.",
    "The app crashes every time I try to upload a photo. Very frustrating.",
    "Friendly staff, tasty food, slightly high prices. We'd probably come back.",
    "The book started slowly, but the last hundred pages were impossible to put down.",
    "Terrible customer service. I called four times and nobody could help me.",
    "The jacket is warm and well made, although the sleeves are a bit long.",
    "Absolutely loved the museum tour; our guide was funny and knew everything.",
    "The instructions were confusing and two screws were missing from the package.",
    "Decent coffee, but the music was so loud we couldn't talk.",
    "This is the third pair of these shoes I've bought. Comfortable from day one.",
    "The film had beautiful scenery but a story that made no sense.",
    "Setup took five minutes and the printer has worked perfectly since.",
    "Arrived on time. The colour is slightly different from the picture.",
    "I wanted to like this restaurant, but the soup was cold and the bread was stale.",
    "The course was well organised and the teacher explained everything clearly.",
    "Battery died after two months. For the price, I expected more.",
    "Average pizza, fast delivery.",
    "My kids play with this puzzle every day. Great value.",
    "The seats were uncomfortable and the flight was delayed, but the crew was very kind.",
    "Honestly the worst haircut I've ever had.",
]
REVIEW_TEMPLATES = [
    "Classify the sentiment of this review as positive, negative or neutral.\n\nReview: \"{x}\"",
    "Is the following customer review positive, negative or mixed? Explain briefly.\n\n{x}",
    "Label the sentiment of this review with one word (positive, negative or neutral), then give a one-sentence reason.\n\n\"{x}\"",
]
HEADLINES = [
    "Local team wins championship after dramatic penalty shootout",
    "Central bank raises interest rates for the third time this year",
    "Scientists discover new species of frog in mountain rainforest",
    "Parliament votes on new law to expand public transport",
    "Popular singer announces world tour starting in March",
    "Tech company reports record profits despite chip shortage",
    "Marathon runner breaks national record in rainy conditions",
    "New telescope captures detailed images of distant galaxy",
    "Film festival opens with documentary about ocean life",
    "City council approves budget for three new schools",
    "Electric car sales double compared to last year",
    "Study finds regular walking may improve memory in older adults",
    "Tennis star withdraws from tournament with wrist injury",
    "Streaming service cancels hit comedy after two seasons",
    "Prime minister meets regional leaders to discuss trade",
    "Startup raises 20 million dollars to develop battery recycling",
    "Researchers grow tomatoes in simulated Martian soil",
    "Museum reopens with exhibition of modern sculpture",
]
HEADLINE_TEMPLATES = [
    "Classify this news headline into one of these categories: politics, sports, business, science, "
    "entertainment.\n\nHeadline: {x}",
    "Which section of a newspaper would this headline belong in: politics, sports, business, science or "
    "entertainment? Answer with the category and a short reason.\n\n\"{x}\"",
]
MESSAGES_SPAM = [
    "Congratulations! You have won a free cruise. Click here within 24 hours to claim your prize.",
    "Hi Sam, are we still meeting for lunch on Thursday at 12:30?",
    "Your account has been suspended. Verify your password immediately at the link below.",
    "Reminder: your dentist appointment is tomorrow at 9:15 am.",
    "Earn 5,000 dollars a week working from home! No experience needed!",
    "The notes from Monday's team meeting are attached. Let me know if I missed anything.",
    "URGENT: Your package could not be delivered. Pay a 1.99 fee to reschedule delivery.",
    "Thanks for your order! Your receipt is attached and your items will ship within two days.",
    "You have been selected for an exclusive investment opportunity with guaranteed 300% returns.",
    "Mum says dinner is at seven on Sunday. Bring a dessert if you can.",
]
SPAM_TEMPLATES = [
    "Is the following message spam or not spam? Answer and explain why.\n\nMessage: \"{x}\"",
    "Classify this text message as 'spam' or 'legitimate'.\n\n{x}",
]
TICKETS = [
    "I was charged twice for my subscription this month.",
    "The app won't open after the latest update on my phone.",
    "My parcel says delivered but it isn't at my door.",
    "How do I change the email address on my account?",
    "I'd like a refund for the kettle I sent back last week.",
    "The website shows an error when I try to reset my password.",
    "Can I change the delivery address for an order I placed an hour ago?",
    "Why is there a late payment fee on my latest invoice?",
    "My order arrived with one item missing.",
    "I want to close my account and delete my data.",
]
TICKET_TEMPLATES = [
    "Route this customer message to the right team: billing, technical support, shipping or account "
    "management.\n\nMessage: \"{x}\"",
    "Which category does this support request belong to: billing, technical, shipping or account? Reply "
    "with the category and one sentence of explanation.\n\n{x}",
]
ANIMALS = ["dolphin", "eagle", "crocodile", "salmon", "butterfly", "bat", "penguin", "frog", "shark", "ant",
           "whale", "lizard", "owl", "tuna", "beetle", "horse", "turtle", "parrot", "snake", "bee", "goat",
           "trout", "ostrich", "salamander"]
FOODS = ["apple", "carrot", "banana", "broccoli", "mango", "spinach", "grape", "potato", "strawberry",
         "onion", "cucumber", "pear", "lettuce", "cherry", "cabbage", "plum", "pepper", "peach", "celery", "kiwi"]
SENTENCES_FORMALITY = [
    "Yo, what's up? Wanna hang out later?",
    "We would be grateful if you could confirm your attendance by Friday.",
    "Thanks a bunch, you're a lifesaver!",
    "Please find attached the report requested during yesterday's meeting.",
    "Gonna be a bit late, traffic is crazy.",
    "The board has approved the proposal subject to minor amendments.",
]

# ---------------------------------------------------------------------------
# rewrite: (sentence, register) with register f(ormal), i(nformal) or n(eutral)
# ---------------------------------------------------------------------------
REWRITE_SENTENCES = [
    ("hey, can u send me the report asap? need it for the meeting", "i"),
    ("We regret to inform you that your application has not been successful on this occasion.", "f"),
    ("The implementation of the new policy will necessitate significant modifications to existing procedures.", "f"),
    ("I think maybe we should probably try to finish the project a bit earlier if that's possible.", "n"),
    ("The weather forecast indicates a high probability of precipitation throughout the afternoon.", "f"),
    ("Our company is committed to delivering innovative solutions that exceed customer expectations.", "f"),
    ("The kids were super loud at the party and the neighbours got pretty annoyed.", "i"),
    ("Due to unforeseen circumstances, the event scheduled for Saturday has been postponed indefinitely.", "f"),
    ("Mitochondria are organelles that generate most of the chemical energy needed to power a cell's reactions.", "f"),
    ("The meeting was long and boring and nothing really got decided.", "i"),
    ("Please ensure that all personal belongings are removed from the premises prior to departure.", "f"),
    ("So sorry I missed your call, I was stuck in traffic for ages.", "i"),
    ("The museum, which was founded in 1890, houses an extensive collection of maritime artefacts.", "f"),
    ("Customers who fail to return borrowed equipment within the specified period will incur additional charges.", "f"),
    ("This phone is good and the camera is good and the battery is also good.", "n"),
    ("It is imperative that all employees complete the mandatory safety training by the end of the month.", "f"),
    ("The new park will give people a place to relax, play sports and meet their neighbours.", "n"),
    ("He was so tired after the long journey that he fell asleep on the sofa without eating dinner.", "n"),
    ("In light of recent developments, we are reconsidering our approach to remote work.", "f"),
    ("The food was okay but honestly kind of overpriced for what you get.", "i"),
    ("Regular physical activity has been shown to reduce the risk of numerous chronic diseases.", "f"),
    ("I can't come to the meeting tomorrow because I've got a doctor's appointment.", "i"),
    ("The committee has reached a consensus regarding the allocation of funds for the upcoming fiscal year.", "f"),
    ("We should grab lunch sometime next week if you're free.", "i"),
    ("The river rose quickly after three days of heavy rain, and several roads were closed.", "n"),
    ("Learning to play an instrument takes patience, practice and a willingness to make mistakes.", "n"),
    ("Notwithstanding the aforementioned considerations, the proposal remains viable.", "f"),
    ("That new cafe downtown is awesome, you gotta try their cinnamon rolls.", "i"),
    ("The software update contains several improvements to performance and stability.", "n"),
    ("Kindly refrain from using mobile telephones during the performance.", "f"),
]
REWRITE_OPS = {
    "paraphrase": ("fin", "Paraphrase this sentence: \"{s}\""),
    "simplify": ("fn", "Rewrite the following sentence in simpler language: \"{s}\""),
    "formal": ("in", "Rewrite this in a more formal tone: \"{s}\""),
    "casual": ("fn", "Make this sentence sound more casual and friendly: \"{s}\""),
    "shorten": ("fin", "Shorten this sentence without losing its meaning: \"{s}\""),
    "child": ("f", "Rewrite this so that a child could understand it: \"{s}\""),
    "two_ways": ("fin", "Give two different ways to rephrase this sentence: \"{s}\""),
    "professional": ("i", "Rewrite this message so it sounds professional enough to send to a manager: \"{s}\""),
}
GRAMMAR_SENTENCES = [
    "She don't like going to the dentist.",
    "Me and him goes to the same school.",
    "There is many reasons to visit the museum.",
    "I have went to that restaurant twice.",
    "The childrens was playing outside all day.",
    "If I would have known, I would have came earlier.",
    "Each of the students have their own locker.",
    "He runned to the shop before it closes.",
    "Their going to the cinema tonight, aren't they?",
    "The informations in the report is not correct.",
]
GRAMMAR_TEMPLATES = [
    "Correct the grammar in this sentence: \"{s}\"",
    "Fix any grammar mistakes in the following sentence and explain the changes: \"{s}\"",
]
PASSIVE_SENTENCES = [
    "The cake was eaten by the children.",
    "The letter was written by my grandfather in 1952.",
    "The new bridge will be opened by the mayor next week.",
    "The window was broken by a football.",
    "The results were announced by the committee on Friday.",
    "The song was performed by a local choir.",
    "The house is cleaned by a professional company every month.",
    "The mistake was noticed by an alert customer.",
]
PASSIVE_TEMPLATE = "Rewrite this sentence in the active voice: \"{s}\""

# ---------------------------------------------------------------------------
# comparison: (a, b, context suffix)
# ---------------------------------------------------------------------------
COMPARISON_PAIRS = [
    ("cats", "dogs", " as pets"), ("trains", "planes", " for a 500-kilometre trip"), ("renting", "buying", " a home"),
    ("e-books", "printed books", ""), ("tea", "coffee", ""), ("Python", "JavaScript", " for a beginner programmer"),
    ("solar power", "wind power", ""), ("working from home", "working in an office", ""),
    ("a laptop", "a tablet", " for a university student"), ("city life", "country life", ""),
    ("credit cards", "debit cards", ""), ("lions", "tigers", ""), ("the Moon", "Mars", " as places for humans to explore"),
    ("baking", "frying", " as ways of cooking fish"), ("frogs", "toads", ""), ("alligators", "crocodiles", ""),
    ("the violin", "the cello", ""), ("fiction", "non-fiction", ""), ("team sports", "individual sports", " for children"),
    ("electric cars", "petrol cars", ""), ("email", "instant messaging", " at work"),
    ("a gym membership", "exercising at home", ""), ("butter", "olive oil", " for cooking"),
    ("hurricanes", "tornadoes", ""), ("a museum", "a zoo", " for a school trip"),
    ("reading a novel", "watching its film adaptation", ""), ("a savings account", "investing in shares", ""),
    ("online courses", "classroom courses", ""), ("bees", "wasps", ""), ("stars", "planets", ""),
    ("rivers", "canals", ""), ("paper maps", "GPS apps", " for hiking"), ("handwritten notes", "typed notes", " for studying"),
    ("a mountain holiday", "a beach holiday", ""), ("the piano", "the violin", " for an adult beginner"),
    ("renewable energy", "fossil fuels", ""), ("a monarchy", "a republic", ""), ("buses", "trams", " in a city"),
    ("wool", "cotton", " for winter clothing"), ("rabbits", "hamsters", " as pets for a young child"),
    ("chess", "checkers", ""), ("a desktop computer", "a laptop", " for home use"), ("sushi", "sashimi", ""),
    ("jogging", "swimming", " as exercise"), ("weather radar", "weather satellites", ""),
]
COMPARISON_TEMPLATES = [
    "Compare {a} and {b}{c}.",
    "What are the main differences between {a} and {b}{c}?",
    "Give two advantages and two disadvantages each of {a} and {b}{c}.",
    "Which is better{c}, {a} or {b}? Discuss both sides briefly.",
    "How are {a} and {b} similar, and how are they different?",
]

# ---------------------------------------------------------------------------
# definition
# ---------------------------------------------------------------------------
DEFINITION_TERMS = [
    "democracy", "metaphor", "inflation", "ecosystem", "algorithm", "gravity", "biodiversity", "renewable energy",
    "noun", "adjective", "irony", "carbon footprint", "budget deficit", "empathy", "peninsula", "fossil", "atom",
    "mortgage", "evaporation", "simile", "immune system", "omnivore", "river delta", "friction", "galaxy",
    "database", "spreadsheet", "cloud computing", "firewall", "nostalgia", "tariff", "supply and demand",
    "hypothesis", "mammal", "erosion", "archipelago", "dividend", "protagonist", "alliteration", "fraction",
    "prime number", "equation", "glacier", "vertebrate", "monopoly", "the Renaissance", "allergy", "deadline",
    "procrastination", "placebo", "camouflage", "variable (in programming)", "function (in programming)", "API",
    "metabolism", "thesaurus", "census", "abbreviation", "sustainability", "gross domestic product",
    "satellite", "symphony", "proverb", "photosynthesis", "latitude", "opinion", "recession", "biography",
]
DEFINITION_TEMPLATES = [
    "Define the word \"{t}\" and give an example.",
    "What does \"{t}\" mean?",
    "Give a simple definition of \"{t}\".",
    "Explain the meaning of the term \"{t}\" in one or two sentences.",
    "What is meant by \"{t}\"? Use it in a sentence.",
]

# ---------------------------------------------------------------------------
# dialogue
# ---------------------------------------------------------------------------
DIALOGUE_SCENARIOS = [
    "a customer and a shop assistant discussing a return", "two friends planning a camping trip",
    "a doctor and a patient talking about a sore throat", "a teacher and a student discussing late homework",
    "a tourist asking a local for directions to the museum", "an interviewer and a candidate for a barista job",
    "two colleagues deciding where to eat lunch", "a parent and a child negotiating bedtime",
    "a waiter and a diner who has a nut allergy", "a librarian helping a student find books about space",
    "a landlord and a tenant discussing a leaking roof", "two astronauts on a space station discussing dinner",
    "a detective questioning a witness", "a coach giving a pep talk to a nervous player",
    "a travel agent and a couple planning a honeymoon", "a cat and a dog arguing about who is the better pet",
    "a robot and a child meeting for the first time", "a pharmacist explaining how to take a medicine",
    "two neighbours talking about a noisy party", "a bus driver and a passenger who has the wrong ticket",
    "a chef teaching an apprentice to make fresh pasta", "a museum guide and a curious visitor",
    "two students preparing for a science exam", "a customer calling technical support because the internet is down",
    "a grandparent telling a grandchild about their first job", "a shopkeeper and a customer haggling at a market",
    "a hotel receptionist and a guest whose room is not ready", "two friends choosing which film to watch",
    "an explorer and a guide who are lost in the jungle", "two gardeners comparing their tomato plants",
    "a new employee asking a colleague how the office coffee machine works",
    "a reporter interviewing a baker who has just won a prize", "a knight and a dragon negotiating peace",
    "a mechanic explaining a car problem to a worried driver", "a student asking a professor for advice on choosing a major",
    "a flight attendant and a nervous first-time flyer", "two siblings planning a surprise for their parents' anniversary",
    "a zookeeper answering questions from a school group", "a time traveller from 1900 and someone with a smartphone",
    "an estate agent showing a small flat to a young couple",
]
DIALOGUE_TEMPLATES = [
    "Write a short dialogue between {s}.",
    "Write a conversation between {s}. Keep it to about eight lines.",
    "Create a realistic dialogue between {s}.",
    "Write a funny short dialogue between {s}.",
    "Write a dialogue between {s}, formatted as a script with each speaker's name before their line.",
]


# ---------------------------------------------------------------------------
# Generators: each returns [(group, item)], item = {"prompt": ...} or {"messages": [...]}.
# Candidates in one group share their content (a topic, a passage question...);
# selection takes one per group per round so a category covers as many distinct
# topics as possible before reusing one with another template.
# ---------------------------------------------------------------------------
def gen_multi_turn(r):
    out = []
    for i, (system, user, assistant, follow_ups) in enumerate(CONVERSATIONS):
        for follow_up in follow_ups:
            messages = []
            sys_text = system or (r.choice(SYSTEM_PROMPTS) if r.random() < 0.3 else None)
            if sys_text:
                messages.append({"role": "system", "content": sys_text})
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant},
                         {"role": "user", "content": follow_up}]
            out.append((i, {"messages": messages}))
    return out


def gen_translation(r):
    return [(s, {"prompt": t.format(lang=lang, s=s)})
            for s in TRANSLATION_SENTENCES for lang in LANGUAGES for t in TRANSLATION_TEMPLATES]


def gen_summarization(r):
    out = []
    for title, text, _ in PASSAGES:
        for t in r.sample(SUMMARY_TEMPLATES, 2):
            out.append((title, {"prompt": t.format(p=norm(text), title=title)}))
    return out


def gen_context_qa(r):
    return [((title, q), {"prompt": r.choice(CONTEXT_QA_TEMPLATES).format(p=norm(text), q=q, title=title)})
            for title, text, questions in PASSAGES for q in questions]


def gen_qa(r):
    return [(q, {"prompt": q + s}) for q in QA_QUESTIONS for s in QA_SUFFIXES]


def gen_math(r):
    return [(g.__name__, {"prompt": g(r) + " " + r.choice(STEP_SUFFIXES)})
            for g in MATH_GENERATORS for _ in range(8)]


def gen_code(r):
    out = [(("write", spec), {"prompt": t.format(spec=spec)}) for spec in CODE_WRITE_SPECS for t in CODE_WRITE_TEMPLATES]
    out += [(("fix", desc), {"prompt": t.format(desc=desc, code=code_block(src))})
            for desc, src in CODE_FIX for t in CODE_FIX_TEMPLATES]
    out += [(("explain", src), {"prompt": t.format(code=code_block(src))})
            for src in CODE_EXPLAIN for t in CODE_EXPLAIN_TEMPLATES]
    return out


def gen_explanation(r):
    return [(x, {"prompt": t.format(t=x)}) for x in EXPLANATION_TOPICS for t in EXPLANATION_TEMPLATES]


def gen_list(r):
    return [(s, {"prompt": t.format(n=r.choice(LIST_SIZES), s=s)}) for s in LIST_SUBJECTS for t in LIST_TEMPLATES]


def gen_how_to(r):
    return [(x, {"prompt": t.format(t=x)}) for x in HOW_TO_TASKS for t in HOW_TO_TEMPLATES]


def gen_creative(r):
    return [(s, {"prompt": t.format(s=s)}) for s in CREATIVE_SUBJECTS for t in CREATIVE_TEMPLATES]


def gen_email(r):
    return [(s, {"prompt": t.format(s=s)}) for s in EMAIL_SITUATIONS for t in EMAIL_TEMPLATES]


def gen_classification(r):
    out = []
    for items, templates in ((REVIEWS, REVIEW_TEMPLATES), (HEADLINES, HEADLINE_TEMPLATES),
                             (MESSAGES_SPAM, SPAM_TEMPLATES), (TICKETS, TICKET_TEMPLATES)):
        out += [(x, {"prompt": t.format(x=x)}) for x in items for t in templates]
    for i in range(6):
        animals = ", ".join(r.sample(ANIMALS, r.randint(5, 8)))
        out.append((("animals", i), {"prompt": "Classify each of these animals as a mammal, bird, reptile, "
                                               f"amphibian, fish or insect: {animals}."}))
        foods = ", ".join(r.sample(FOODS, r.randint(6, 9)))
        out.append((("foods", i), {"prompt": f"Sort the following into fruits and vegetables: {foods}."}))
    out += [(x, {"prompt": f"Is this sentence formal or informal? Explain your answer.\n\n\"{x}\""})
            for x in SENTENCES_FORMALITY]
    return out


def gen_rewrite(r):
    out = [(s, {"prompt": t.format(s=s)})
           for s, register in REWRITE_SENTENCES for fits, t in REWRITE_OPS.values() if register in fits]
    out += [(s, {"prompt": t.format(s=s)}) for s in GRAMMAR_SENTENCES for t in GRAMMAR_TEMPLATES]
    out += [(s, {"prompt": PASSIVE_TEMPLATE.format(s=s)}) for s in PASSIVE_SENTENCES]
    return out


def gen_comparison(r):
    return [((a, b), {"prompt": t.format(a=a, b=b, c=c)}) for a, b, c in COMPARISON_PAIRS for t in COMPARISON_TEMPLATES]


def gen_definition(r):
    return [(x, {"prompt": t.format(t=x)}) for x in DEFINITION_TERMS for t in DEFINITION_TEMPLATES]


def gen_dialogue(r):
    return [(s, {"prompt": t.format(s=s)}) for s in DIALOGUE_SCENARIOS for t in DIALOGUE_TEMPLATES]


GENERATORS = {
    "multi_turn": gen_multi_turn, "translation": gen_translation, "summarization": gen_summarization,
    "qa": gen_qa, "math": gen_math, "context_qa": gen_context_qa, "code": gen_code,
    "explanation": gen_explanation, "list": gen_list, "how_to": gen_how_to, "creative": gen_creative,
    "email": gen_email, "classification": gen_classification, "rewrite": gen_rewrite,
    "comparison": gen_comparison, "definition": gen_definition, "dialogue": gen_dialogue,
}
assert list(GENERATORS) == list(TARGETS)


# ---------------------------------------------------------------------------
# Selection and checks
# ---------------------------------------------------------------------------
def item_key(item: dict) -> str:
    """Identity of a prompt: its text, or its whole message list."""
    if "prompt" in item:
        return "p:" + item["prompt"]
    return "m:" + json.dumps(item["messages"], ensure_ascii=False, sort_keys=True)


def load_held_out() -> tuple[set[str], list[str]]:
    """Keys of every held-out request, and all their texts (for the passage check)."""
    keys: set[str] = set()
    texts: list[str] = []
    for path in HELD_OUT:
        if not path.is_file():
            print(f"note: {path} not found; not excluded", file=sys.stderr)
            continue
        for line in path.read_text(encoding="utf-8-sig").splitlines():
            if not line.strip():
                continue
            obj = json.loads(line)
            item = {"prompt": obj["prompt"]} if "prompt" in obj else {"messages": obj["messages"]}
            keys.add(item_key(item))
            texts += [obj["prompt"]] if "prompt" in obj else [m["content"] for m in obj["messages"]]
    return keys, texts


def shingles(text: str, n: int = 8) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def check_passages(held_out_texts: list[str]) -> None:
    held = set().union(*(shingles(t) for t in held_out_texts)) if held_out_texts else set()
    titles = [title for title, _, _ in PASSAGES]
    if len(set(titles)) != len(titles):
        sys.exit("error: duplicate passage titles")
    for title, text, questions in PASSAGES:
        words = len(norm(text).split())
        if not 60 <= words <= 150:
            sys.exit(f"error: passage {title!r} has {words} words (want 60-150)")
        if not questions:
            sys.exit(f"error: passage {title!r} has no questions")
        shared = shingles(text) & held
        if shared:
            sys.exit(f"error: passage {title!r} shares text with a held-out prompt: {' '.join(min(shared))!r}")


def select(cands, n, r, excluded: set[str]):
    """Round-robin over shuffled groups (one candidate per group per round)
    after dropping held-out and repeated prompts; n=None takes everything."""
    groups: dict = {}
    seen = set(excluded)
    for group, item in cands:
        key = item_key(item)
        if key in seen:
            continue
        seen.add(key)
        groups.setdefault(repr(group), []).append(item)
    order = list(groups)
    r.shuffle(order)
    for g in order:
        r.shuffle(groups[g])
    total = sum(len(v) for v in groups.values())
    if n is None:
        n = total
    if total < n:
        raise SystemExit(f"error: only {total} candidates, {n} wanted")
    picked = []
    while len(picked) < n:
        for g in order:
            if groups[g] and len(picked) < n:
                picked.append(groups[g].pop())
    return picked


def build(seed: str = SEED) -> list[dict]:
    excluded, held_texts = load_held_out()
    check_passages(held_texts)
    rows = []
    for category, gen in GENERATORS.items():
        cands = gen(random.Random(f"{seed}/{category}/generate"))
        for item in select(cands, TARGETS[category], random.Random(f"{seed}/{category}/select"), excluded):
            rows.append((category, item))
    random.Random(f"{seed}/order").shuffle(rows)  # interleave categories
    keys = [item_key(item) for _, item in rows]
    if len(set(keys)) != len(keys):
        sys.exit("error: duplicate prompts across categories")
    if len(rows) < MIN_TOTAL:
        sys.exit(f"error: only {len(rows)} prompts (want at least {MIN_TOTAL})")
    width = max(4, len(str(len(rows))))
    return [{"custom_id": f"train-{i:0{width}d}", "category": category, **item, "max_tokens": MAX_TOKENS}
            for i, (category, item) in enumerate(rows, start=1)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", nargs="?", help="output path (default: stdout)")
    ap.add_argument("--seed", default=SEED, help=f"seed string (default: {SEED!r})")
    args = ap.parse_args(argv)
    rows = build(args.seed)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["category"]] = counts.get(row["category"], 0) + 1
    for category in TARGETS:
        print(f"{category:15s} {counts.get(category, 0):5d}", file=sys.stderr)
    print(f"{'total':15s} {len(rows):5d}", file=sys.stderr)


if __name__ == "__main__":
    main()
