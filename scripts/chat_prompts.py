#!/usr/bin/env python3
"""The chat prompt set the SmolLM2-135M-Instruct drafter is self-distilled on (written here, nothing downloaded).

The target model answers these prompts and the drafter learns to predict its answers, so the set has to look
like what people type into a chat app: questions, explanations, how-tos, comparisons, lists, short writing,
rewriting, grammar, translation, word problems, definitions, advice, small coding tasks and chit-chat, mostly
single messages, some multi-turn chats (about 15%) and a few with a system message (about 5%).

Held-out conversations are genuinely unseen: every fifth value of each list (topic, sentence, snippet, chat...)
is reserved for them, the last phrasing of each kind is never used in train, and two word-problem shapes are
held-out only. Everything is deterministic (string-seeded `random.Random`, no set or hash ordering).

    python scripts/chat_prompts.py --out /tmp/chat_prompts   # counts, checks, train.jsonl + held_out.jsonl
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SEED = 2026
TRAIN_SIZE = 2000
HELD_OUT_SIZE = 60
HOLD_EVERY = 5          # value i is held-out when i % HOLD_EVERY == HOLD_EVERY // 2
MULTI_TURN_SHARE = 0.15
SYSTEM_SHARE = 0.05

# --------------------------------------------------------------------------------------------------------------
# Data. Each list feeds one kind of request; templates use {x} for the value unless noted.
# --------------------------------------------------------------------------------------------------------------

NAMES = ("Maya", "Leo", "Priya", "Tom", "Sofia", "Omar", "Hannah", "Diego", "Aisha", "Ben", "Chloe", "Kenji", "Grace",
         "Lucas", "Nadia", "Sam", "Elena", "Jamal", "Ruth", "Ivan", "Zoe", "Marco", "Lily", "Yusuf")

FACT_WRAPS = ("{x}", "Quick question: {x}", "{x} Please keep the answer short.",
              "My kid asked me this and I didn't know the answer: {x}", "{x} A few sentences is enough.",
              "I've always wondered about this. {x}", "{x} Explain it in a way a teenager would understand.",
              "Here's something I never understood. {x}")
FACTS = (
    # science
    "Why is the sky blue?", "What is the boiling point of water at sea level?", "Why do some objects float in water?",
    "What causes rainbows?", "How do magnets work?", "What is the smallest unit of life?", "Why does ice float?",
    "What are the three states of matter?", "How does sound travel?", "What causes thunder?",
    "Why do leaves change color in autumn?", "What is an element on the periodic table?",
    # geography
    "What is the longest river in the world?", "Which continent has the most countries?",
    "What is the largest desert on Earth?", "Why is the Dead Sea so salty?", "How many oceans are there?",
    "What is the highest mountain in Africa?", "What is the capital of Australia?", "Where is the Amazon rainforest?",
    "What is the smallest country in the world?", "Why are there time zones?", "What is the capital of Brazil?",
    # history
    "Who built the pyramids of Giza?", "When did the First World War begin?", "Who was Cleopatra?",
    "What was the Renaissance?", "Why did the Western Roman Empire fall?", "Who invented the printing press?",
    "What was the Industrial Revolution?", "When did humans first land on the Moon?", "What was the Silk Road?",
    "Who was Marie Curie?", "Why was the Great Wall of China built?",
    # cooking
    "Why should you rest meat after cooking it?", "What does it mean to fold ingredients together?",
    "How long should I boil dried spaghetti?", "Why does bread dough need to rise?", "Why do onions make you cry?",
    "How can I tell when an avocado is ripe?", "Why do people add salt to pasta water?",
    "What temperature should chicken be cooked to?", "How long do cooked leftovers keep in the fridge?",
    "What does it mean to caramelize onions?",
    # health (general)
    "How much water should an adult drink each day?", "Why is sleep important?", "What does vitamin D do?",
    "How many hours of sleep do teenagers need?", "Why do we get fevers?", "Is it bad to crack your knuckles?",
    "What are the benefits of walking every day?", "Why is fiber good for you?", "How does sunscreen protect skin?",
    "Why do muscles feel sore a day after exercise?",
    # sport
    "How many players are on a soccer team?", "How long is a marathon?", "How does scoring work in tennis?",
    "How often are the Summer Olympics held?", "What is offside in soccer?", "How many points is a touchdown worth?",
    "What is the Tour de France?", "Why do golf balls have dimples?", "How high is a basketball hoop?",
    "What is a hat trick?",
    # animals
    "How long do elephants live?", "Why do cats purr?", "How do bees make honey?", "Are whales fish or mammals?",
    "How do birds know where to migrate?", "Why do zebras have stripes?", "How fast can a cheetah run?",
    "Do fish sleep?", "Why do dogs wag their tails?", "How do octopuses change color?", "What do pandas eat?",
    # space
    "How far away is the Moon?", "Why does the Moon seem to change shape?", "What is a light-year?",
    "How many planets are in our solar system?", "Why is Mars red?", "What is the Sun made of?",
    "How long does sunlight take to reach Earth?", "Why does Saturn have rings?", "What is a shooting star?",
    "What is the International Space Station?", "Could people live on Mars one day?",
    # everyday tech
    "What does a Wi-Fi router do?", "Why does my phone battery drain faster in the cold?", "What is the cloud?",
    "How does a QR code work?", "What is a VPN used for?", "Why do computers need to restart after updates?",
    "What does 5G mean?", "How does a touchscreen know where I tap?", "What is two-factor authentication?",
    "Why does my laptop get hot?", "What is a pixel?",
)

ABOUT_TEMPLATES = ("Tell me three interesting facts about {x}.", "What are some fun facts about {x}?",
                   "Give me a short overview of {x}.", "Write two or three sentences about {x} for a school report.",
                   "What makes {x} special?", "I'm curious about {x}. What should I know?",
                   "Share one surprising fact about {x}.")
ABOUT = ("octopuses", "the Sahara Desert", "Jupiter", "honeybees", "the Eiffel Tower", "volcanoes", "penguins",
         "the Great Barrier Reef", "the Moon", "coffee", "chess", "the human brain", "Antarctica", "owls",
         "the Olympic Games", "rainforests", "the Nile River", "chocolate", "dolphins", "Mount Everest",
         "the Amazon River", "lightning", "the piano", "tomatoes", "Venice", "sharks", "the Milky Way", "bamboo")

EXPLAIN_TEMPLATES = ("Explain {x} simply.", "Can you explain {x} in simple terms?", "Explain {x} like I'm five.",
                     "I never really understood {x}. Could you explain it in a few sentences?",
                     "Give me a beginner-friendly explanation of {x}.",
                     "How would you explain {x} to a twelve-year-old?", "Explain {x} using an everyday analogy.",
                     "Please explain {x} in plain English, without jargon.")
EXPLAIN = ("photosynthesis", "inflation", "compound interest", "how a blockchain works", "machine learning", "gravity",
           "how vaccines work", "the water cycle", "electricity", "DNA", "black holes", "recursion in programming",
           "how the internet works", "a credit score", "the greenhouse effect", "supply and demand",
           "evolution by natural selection", "how a refrigerator keeps food cold", "the stock market",
           "how airplanes stay in the air", "the immune system", "encryption", "what an API is", "climate change",
           "the theory of relativity", "how batteries work", "what a calorie is", "the placebo effect",
           "how GPS finds your location", "interest rates", "how tides work", "a neural network", "opportunity cost",
           "how the heart pumps blood", "the scientific method", "cloud computing", "how a search engine works",
           "the food chain", "plate tectonics", "how solar panels make electricity", "how income tax works",
           "open-source software")

HOWTO_TEMPLATES = ("How do I {x}?", "What are the steps to {x}?", "Can you walk me through how to {x}?",
                   "I've never done this before. How do I {x}?", "What's the easiest way to {x}?",
                   "Give me step-by-step instructions to {x}.", "Any tips on how to {x}? I'm a beginner.",
                   "Explain how to {x}, as if I'm a total beginner.")
HOWTO = ("boil an egg so the yolk stays soft", "change a flat tire", "make a good cup of coffee at home",
         "back up the photos on my phone", "start running if I'm out of shape", "clean a cast iron pan",
         "write a cover letter", "remove a coffee stain from a white shirt", "keep houseplants alive",
         "set up a monthly budget", "tie a tie", "learn to touch type", "make bread without a bread machine",
         "organize a messy closet", "unclog a bathroom sink", "plant tomatoes in pots", "speed up a slow laptop",
         "prepare for a job interview", "train my dog to sit", "make a simple tomato sauce", "clean my laptop screen",
         "start a vegetable garden", "learn a new language on my own", "make friends in a new city",
         "write a good thank-you speech", "sharpen a kitchen knife", "set up a home Wi-Fi network",
         "cook rice on the stove", "get rid of fruit flies in my kitchen", "iron a shirt", "paint a room",
         "create a strong password I can remember", "meal prep for the week", "make a paper airplane that flies far",
         "take better photos with my phone", "save money on groceries", "start meditating", "fix a squeaky door hinge",
         "wash a wool sweater", "get better at public speaking")

COMPARE_TEMPLATES = ("What is the difference between {a} and {b}?", "How does {a} differ from {b}?",
                     "Can you compare {a} and {b} for me?", "I always mix up {a} and {b}. What's the difference?",
                     "Explain the difference between {a} and {b} in two or three sentences.",
                     "What do {a} and {b} have in common, and how are they different?",
                     "When people talk about {a} and {b}, what's the real difference?")
COMPARE = (("weather", "climate"), ("a virus", "a bacterium"), ("a list", "a tuple in Python"),
           ("baking soda", "baking powder"), ("an alligator", "a crocodile"), ("RAM", "storage"),
           ("a comet", "an asteroid"), ("affect", "effect"), ("a latte", "a cappuccino"), ("stocks", "bonds"),
           ("speed", "velocity"), ("HTTP", "HTTPS"), ("a simile", "a metaphor"), ("a lake", "a pond"),
           ("a frog", "a toad"), ("mitosis", "meiosis"), ("a hurricane", "a tornado"), ("let", "const in JavaScript"),
           ("SQL", "NoSQL databases"), ("a debit card", "a credit card"), ("a rabbit", "a hare"),
           ("an ocean", "a sea"), ("renting", "buying a home"), ("weight", "mass"), ("a CPU", "a GPU"),
           ("a psychologist", "a psychiatrist"), ("Wi-Fi", "Bluetooth"), ("a herb", "a spice"),
           ("an atom", "a molecule"), ("jam", "jelly"), ("git merge", "git rebase"), ("baking", "roasting"),
           ("a violin", "a viola"), ("a moth", "a butterfly"), ("a diesel engine", "a petrol engine"),
           ("empathy", "sympathy"), ("a podcast", "a radio show"), ("a laptop", "a tablet for studying"))

IDEA_TEMPLATES = ("Give me {n} ideas for {x}.", "Can you list {n} ideas for {x}?",
                  "I need some inspiration. What are {n} good ideas for {x}?",
                  "Brainstorm {n} ideas for {x}, one line each.", "List {n} creative ideas for {x}.",
                  "Suggest {n} ideas for {x}. Keep each one short.", "What are {n} simple ideas for {x}?")
IDEAS = ("a rainy afternoon with kids", "a cheap date night", "a science fair project", "a blog about gardening",
         "a weekend trip without a car", "a vegetarian dinner", "a birthday party for a seven-year-old",
         "a small balcony garden", "staying active while working from home", "a retirement gift for a coworker",
         "a family game night", "using leftover rice", "decorating a small bedroom", "a history podcast episode",
         "a school fundraiser", "a picnic lunch", "a team-building activity at work", "a cozy winter evening",
         "a Halloween costume", "a beginner woodworking project", "a cooking video channel",
         "a thank-you gift for a teacher", "a healthy breakfast", "a short story plot", "a quiet hobby",
         "a neighborhood clean-up day", "a road-trip playlist", "a name for a bakery", "a morning routine",
         "keeping a journal")
LIST_TEMPLATES = ("List {n} {x}.", "Name {n} {x}.", "What are {n} {x}?", "Give me a list of {n} {x}.",
                  "Can you name {n} {x}? A short list is fine.", "Make a numbered list of {n} {x}.")
LISTS = ("fruits that are high in vitamin C", "ways to reduce stress", "common mistakes new programmers make",
         "reasons to learn a second language", "famous inventors and what they invented", "easy houseplants",
         "board games for two players", "habits of productive people", "animals that live in the Arctic",
         "vegetables that grow well in pots", "classic novels worth reading", "ways to save electricity at home",
         "questions to ask in a job interview", "benefits of drinking water", "foods that are good sources of protein",
         "things to pack for a beach day", "stretches for people who sit all day", "ways to be a better listener",
         "countries in South America", "famous paintings", "uses for baking soda around the house",
         "tips for writing clear emails", "famous bridges around the world", "signs that you need a break",
         "kitchen tools every beginner cook needs", "ways to make a small room feel bigger",
         "free things to do in a big city", "skills that are useful in any job", "good habits for a healthy heart",
         "words that are often misspelled")

EMAIL_TEMPLATES = ("Write a short email {x}.", "Can you draft a polite email {x}?", "Help me write a brief email {x}.",
                   "Write a friendly email {x}. Keep it under 100 words.",
                   "I need to send an email {x}. Can you write it for me? My name is {name}.",
                   "Draft a professional email {x}.", "Write an email {x}. Sign it from {name}.")
EMAILS = ("to my landlord about a leaking kitchen tap", "to my manager asking for Friday off",
          "to my son's teacher explaining that he was sick yesterday", "to a customer apologizing for a late delivery",
          "to a colleague thanking them for helping with a report", "to my neighbors about a lost cat",
          "to a hotel asking whether they have parking", "declining a meeting invitation politely",
          "to a gym canceling my membership", "to a client asking for feedback on a project",
          "inviting my team to a farewell lunch", "to a recruiter following up after an interview",
          "to a restaurant about a birthday reservation for eight people", "asking a professor for an extension",
          "to a friend I haven't seen in years", "to a plumber asking for a quote", "announcing a new office address",
          "reminding a client about an unpaid invoice", "to my book club suggesting the next book",
          "welcoming a new employee to the team", "to a store asking about a refund for a broken lamp",
          "asking a coworker to swap shifts", "to parents about a school trip next month",
          "to my team explaining that a deadline has moved")
THANKS_TEMPLATES = ("Write a thank-you note to {x}.", "Can you help me write a short thank-you message to {x}?",
                    "Write a warm, two-sentence thank-you card to {x}.", "I want to thank {x}. What should I write?",
                    "Write a heartfelt but short thank-you note to {x}.", "Draft a casual thank-you text to {x}.")
THANKS = ("my aunt for the birthday sweater", "a coworker who covered my shift", "my neighbor who watered my plants",
          "my teacher at the end of the school year", "a friend who helped me move", "the nurses who cared for my dad",
          "my team after a big launch", "my grandparents for the weekend visit", "a mentor who gave me career advice",
          "wedding guests for their gifts", "a stranger who returned my wallet", "my coach after the season",
          "a host family after my exchange year", "a volunteer at the food bank", "my sister for babysitting",
          "a customer for their first order")
PRODUCT_TEMPLATES = ("Write a short product description for {x}.",
                     "Write a catchy description of {x} for an online shop.",
                     "Can you write a two-sentence product blurb for {x}?",
                     "I'm selling {x}. Write a friendly description for the listing.",
                     "Write a product description for {x} in under 60 words.",
                     "Describe {x} for a website. Mention who it's for.")
PRODUCTS = ("a stainless steel water bottle that keeps drinks cold for 24 hours", "a handmade ceramic coffee mug",
            "a pair of noise-canceling headphones", "a lavender-scented soy candle", "a foldable travel backpack",
            "a kids' picture book about a brave snail", "a bamboo cutting board", "a wireless phone charger",
            "a wool winter hat", "a beginner's watercolor painting set",
            "a smart plug that works with voice assistants", "a set of reusable beeswax food wraps",
            "an ergonomic office chair", "a weekly planner notebook", "a portable Bluetooth speaker",
            "organic dark chocolate with sea salt", "a cast iron skillet", "a pet bed for large dogs",
            "a solar-powered garden light")
POEM_TEMPLATES = ("Write {form} about {x}.", "Can you write {form} about {x}?", "Compose {form} about {x}.",
                  "I'd love {form} about {x}.", "Write {form} about {x} for a greeting card.",
                  "Please write {form} about {x}. Make it gentle and hopeful.")
POEM_FORMS = ("a short poem", "a haiku", "a four-line rhyming poem", "a limerick", "a short free-verse poem")
POEMS = ("the ocean", "autumn leaves", "a cup of tea", "the city at night", "a lazy cat", "the first snow",
         "friendship", "a thunderstorm", "the Moon", "a garden in spring", "Monday mornings", "an old bicycle",
         "the stars", "a long train ride", "baking bread", "a lighthouse", "a mountain lake", "homework", "a rainy day",
         "a sunflower", "grandma's kitchen", "a busy bee", "the end of summer", "a quiet library", "a river",
         "the smell of coffee", "learning to code", "a snowman", "a lost umbrella", "the sunrise")
STORY_TEMPLATES = ("Write a very short story about {x}.", "Tell me a story in five sentences about {x}.",
                   "Write a bedtime story for a child about {x}. Keep it short.",
                   "Write a three-sentence story about {x}.",
                   "Can you write a short story with a happy ending about {x}?",
                   "Write a tiny story, under 100 words, about {x}. The main character is called {name}.",
                   "Write a short funny story about {x}.")
STORIES = ("a robot who learns to paint", "a lost dog finding its way home", "a dragon who is afraid of the dark",
           "a girl who finds a map in a library book", "a snail entering a race", "the last tree in a city",
           "a baker who bakes bread that makes people honest", "a boy and a talking bicycle",
           "a lighthouse keeper on a stormy night", "a cat who becomes the mayor of a small town",
           "two strangers stuck in an elevator", "a kite that flies away on its own",
           "an astronaut's first day on Mars", "a shy ghost who wants to make friends", "a message in a bottle",
           "a grandfather's old watch", "a penguin who wants to fly", "a village where it never stops raining",
           "a chef who loses their sense of taste", "a tiny mouse who saves a lion",
           "a time traveler who visits a school", "a magic paintbrush", "the first day at a new school",
           "a fox and a crow who become friends", "a library that opens only at midnight")

REWRITE_TEMPLATES = ("Summarize this in one sentence:\n\n{x}", "Rewrite this paragraph to sound more formal:\n\n{x}",
                     "Make this shorter and clearer:\n\n{x}", "Rewrite the following for a ten-year-old:\n\n{x}",
                     "What is the main point of this text?\n\n{x}", "Rewrite this in a friendlier tone:\n\n{x}",
                     "Turn this into three bullet points:\n\n{x}", "Paraphrase the following text:\n\n\"{x}\"")
PASSAGES = (
    "Our team met on Tuesday to talk about the new website. Everyone agreed the homepage is too busy. We decided to "
    "remove the slideshow, make the search bar bigger, and launch the new design before the end of the month.",
    "Bees are very important for farming. When they move from flower to flower, they carry pollen, which helps "
    "plants make fruit and seeds. Without bees, many crops like apples and almonds would be much harder to grow.",
    "hey so the meeting got moved to thursday at 3 because half the people were out sick. bring your laptop and the "
    "numbers from last quarter. also someone needs to book the big room, it's not booked yet",
    "The library will be closed on Monday for repairs to the heating system. Books that are due that day can be "
    "returned on Tuesday without a late fee. The online catalog will stay available during the closure.",
    "Walking for thirty minutes a day can improve your mood, help you sleep better, and strengthen your heart. You "
    "do not need special equipment or a gym membership. Many people find it easiest to walk after lunch or dinner.",
    "The town council voted to turn the empty parking lot on Elm Street into a community garden. Residents will be "
    "able to rent small plots for a low yearly fee. Work on the garden is expected to start in the spring.",
    "I bought this blender last month and honestly it's been a disappointment. It's super loud, the lid doesn't "
    "close properly, and it can't even crush ice. The only good thing is that it's easy to clean.",
    "Octopuses are clever animals. They can open jars, solve simple puzzles, and escape from tanks. Each of their "
    "eight arms has many nerve cells, so the arms can react to things almost on their own.",
    "Due to unexpected demand, the delivery of your order will take longer than planned. We now expect it to arrive "
    "within ten working days. We apologize for the delay and thank you for your patience.",
    "Learning to cook at home saves money and is usually healthier than eating out. Start with a few simple recipes "
    "you enjoy, like pasta or soup, and cook them until you feel confident before trying harder dishes.",
    "The museum's new exhibit shows how people lived in the city two hundred years ago. Visitors can walk through a "
    "rebuilt kitchen, try on old-fashioned clothes, and listen to recordings of stories told by local families.",
    "Remote work has changed how many companies operate. Some workers enjoy skipping the commute and having more "
    "flexible hours, while others miss chatting with coworkers and find it harder to separate work from home life.",
    "Please remember that the office kitchen is shared by everyone. Wash your dishes after using them, label your "
    "food in the fridge, and throw away anything that has expired by Friday afternoon.",
    "The first bicycles, built in the early 1800s, had no pedals. Riders pushed themselves along with their feet. "
    "Pedals, chains, and air-filled tires came later and made cycling faster and much more comfortable.",
    "Sleep is when the body repairs itself and the brain sorts through what it learned during the day. Adults who "
    "regularly sleep less than seven hours are more likely to feel tired, forgetful, and easily stressed.",
    "Our neighborhood book swap is back! Bring up to five books you have finished, and take home as many as you "
    "brought. Children's books are especially welcome. The swap runs from ten until noon in the school hall.",
    "Volcanoes form where melted rock from deep inside the Earth pushes up through the crust. Some erupt with huge "
    "explosions, while others release slow rivers of lava. Many volcanoes stay quiet for hundreds of years.",
    "i think we should go with the cheaper option for the printer tbh. the expensive one has more features but we "
    "literally only print like ten pages a week so it doesn't make sense to pay double for it",
    "Composting turns food scraps and garden waste into rich soil. You need a mix of green material, like vegetable "
    "peels, and brown material, like dry leaves. Turning the pile every week helps it break down faster.",
    "The city's buses will run on a holiday schedule next Monday. Most routes will come every thirty minutes instead "
    "of every fifteen, and the night buses will not run. Regular service returns on Tuesday morning.",
)
GRAMMAR_TEMPLATES = ("Fix the grammar in this sentence: {x}", "Can you correct this? \"{x}\"",
                     "Is this sentence correct? {x}", "Please proofread this: {x}", "Correct any mistakes: {x}",
                     "What's wrong with this sentence? \"{x}\"", "Rewrite this so the grammar is correct: {x}")
GRAMMAR = ("Me and him goes to the store yesterday.", "Their going to the park later.", "She don't like coffee.",
           "I seen that movie last week.", "The dog wagged it's tail.", "Each of the students have a book.",
           "We was late because of the traffic.", "Can you borrow me a pen?", "He runs more faster than me.",
           "I have went there many times.", "There is three apples on the table.", "Your the best friend ever.",
           "The informations are on the website.", "She is more taller than her sister.",
           "If I would have known, I would have come.", "Him and me are going to the game.",
           "The childrens are playing outside.", "I didn't do nothing wrong.", "Who's book is this?",
           "Less people came to the party this year.", "She gave the gift to my brother and I.", "I am agree with you.",
           "He don't know where the keys is.", "The team are winning there game.",
           "Between you and I, the plan won't work.", "I look forward to hear from you.",
           "Everyone should bring their own lunch's.", "We goes swimming every Sunday.",
           "The meeting will be held on Monday at 3 pm in the morning.", "Its been a long day for the both of us.")
TRANSLATE_TEMPLATES = ("Translate into {lang}: {x}", "How do you say \"{x}\" in {lang}?",
                       "Can you translate this sentence into {lang}? {x}", "What is \"{x}\" in {lang}?",
                       "Please translate the following sentence into {lang}: \"{x}\"",
                       "I'm learning {lang}. How would I say: {x}",
                       "Translate to {lang} and explain any tricky words: {x}")
LANGUAGES = ("French", "Spanish", "German")
SENTENCES = ("Where is the train station?", "I would like a glass of water, please.", "My sister has two cats.",
             "The weather is nice today.", "What time is it?", "I am learning to cook.",
             "We are going to the beach tomorrow.", "Can you help me, please?", "This book is very interesting.",
             "I live in a small town near the sea.", "How much does this cost?", "My favorite color is green.",
             "The children are playing in the garden.", "I don't understand the question.",
             "We ate dinner at a nice restaurant.", "Happy birthday, my friend!",
             "The shop opens at nine in the morning.", "I need to buy bread and milk.", "It is raining again.",
             "Do you speak English?", "I have a meeting at noon.", "Thank you for your help.",
             "The museum is closed on Mondays.", "My brother plays the guitar.", "I am tired after work.",
             "Let's meet in front of the cinema.", "The soup is too hot.", "She reads a book every week.",
             "Where can I find a pharmacy?", "I love summer evenings.")
DEFINE_TEMPLATES = ("What does \"{x}\" mean?", "Define {x}.", "What is the meaning of the word \"{x}\"?",
                    "Can you define {x} and use it in a sentence?", "What's a simple definition of {x}?",
                    "I keep hearing the word \"{x}\". What does it mean?",
                    "Give me a short definition of \"{x}\" with an example.")
DEFINE = ("serendipity", "ubiquitous", "algorithm", "mortgage", "empathy", "procrastination", "nostalgia", "ecosystem",
          "resilience", "ambiguous", "bandwidth", "photosynthetic", "hypothesis", "irony", "metabolism", "dividend",
          "biodiversity", "pragmatic", "encryption key", "deadline", "sustainable", "mindfulness", "meticulous",
          "latency", "equity", "cognitive bias", "gig economy", "firewall", "eloquent", "quarantine", "benchmark",
          "carbon footprint", "haiku", "democracy", "vintage", "paradox", "courteous", "startup", "fiscal year",
          "symbiosis", "ephemeral", "redundant", "curriculum", "renewable energy")

ADVICE_TEMPLATES = ("{x} Any advice?", "{x} What should I do?", "{x} Can you give me a few tips?",
                    "I need some advice. {x}", "{x} What would you suggest?",
                    "Here's my situation: {x} How can I handle it better?",
                    "{x} What are some practical steps I can take this week?")
ADVICE = ("I have an exam in two weeks and I keep procrastinating.",
          "I can't fall asleep before 2 a.m., even when I'm tired.",
          "I'm traveling to Japan for the first time next month.", "I spend too much money on takeout every month.",
          "I just started a new job and I feel overwhelmed.", "My roommate never does the dishes.",
          "I want to get fit, but I only have 20 minutes a day.", "I forget most of what I read in textbooks.",
          "I'm flying with a toddler for the first time.", "I get nervous before giving presentations.",
          "I wake up tired even after eight hours of sleep.", "I want to start saving, but my salary is small.",
          "I check my phone constantly and it distracts me from work.",
          "I'm moving to a new city where I don't know anyone.",
          "I have a long-haul flight next week and I always get jet lag.", "My kids don't want to read books.",
          "I keep putting off going to the dentist.", "I have too many subscriptions and I don't know which to cancel.",
          "I'm studying for a language test and I can't remember vocabulary.", "I want to ask for a promotion.",
          "I'm going backpacking in Europe on a tight budget.", "I drink four cups of coffee a day and sleep badly.",
          "I'm a college student and I can never finish my assignments on time.", "My desk job gives me back pain.",
          "I'm planning a wedding with a small budget.", "I want to learn to code but don't know where to start.",
          "I have credit card debt and I don't know what to pay off first.", "I'm always late to everything.",
          "I feel lonely since I started working from home.", "I'm going camping for the first time.")
TIPS_TEMPLATES = ("What are your best tips for {x}?", "What should I know about {x}?",
                  "Give me some practical advice on {x}.", "I could use some help with {x}. Any tips?",
                  "What are a few simple habits that help with {x}?", "What do experts usually recommend for {x}?")
TIPS = ("studying for a math test", "sleeping better", "packing light for a trip", "sticking to a monthly budget",
        "staying focused while working from home", "taking notes in lectures", "saving for a vacation",
        "beating jet lag", "learning vocabulary in a new language", "keeping a tidy home",
        "eating healthier on a budget", "managing my time at work", "preparing for a long hike",
        "writing a strong résumé", "napping without feeling groggy", "traveling with kids", "paying off debt",
        "remembering what I study", "keeping a morning routine", "making small talk", "staying motivated to exercise",
        "planning a road trip", "reducing screen time before bed", "negotiating the price of a used car")

LANG_NAMES = {"python": "Python", "javascript": "JavaScript", "sql": "SQL", "bash": "bash", "css": "CSS"}
PY_TEMPLATES = ("Write a Python function that {x}.", "Can you write a Python function that {x}?",
                "I need a Python function that {x}. Please keep it simple.",
                "Write a short Python function that {x}, with a docstring.",
                "How would I write a function in Python that {x}?",
                "Show me a Python function that {x}, plus an example call.",
                "Write Python code for a function that {x}. Add a comment or two.")
PY_TASKS = ("checks whether a string is a palindrome", "returns the n-th Fibonacci number",
            "counts how many times each word appears in a sentence",
            "removes duplicates from a list but keeps the order", "converts a temperature from Celsius to Fahrenheit",
            "returns the second largest number in a list", "checks whether a number is prime",
            "reverses the order of the words in a sentence", "flattens a list of lists into one list",
            "finds the most common character in a string", "merges two sorted lists into one sorted list",
            "returns the sum of the digits of an integer", "checks whether two words are anagrams",
            "capitalizes the first letter of every word in a string",
            "computes the factorial of a number without recursion", "returns only the even numbers from a list",
            "returns the average of a list of numbers, or None if the list is empty", "counts the vowels in a string",
            "returns the longest word in a sentence", "checks whether a year is a leap year",
            "splits a list into chunks of a given size", "returns the number of days between two dates",
            "generates a random password of a given length", "reads a CSV file and returns the rows as dictionaries",
            "finds the greatest common divisor of two numbers", "converts seconds into hours, minutes, and seconds",
            "checks whether a list is sorted", "removes all punctuation from a string",
            "finds an item in a sorted list using binary search", "rotates a list to the right by k steps",
            "returns the items that appear in both of two lists", "converts a Roman numeral to an integer",
            "counts the lines in a text file", "checks whether a string looks like an email address",
            "returns the running total of a list of numbers", "prints a multiplication table for a given number",
            "groups a list of words by their first letter", "converts a string to title case without using .title()",
            "returns the k largest values in a list", "counts how many days are left until New Year")
JS_TEMPLATES = ("Write a JavaScript function that {x}.", "Can you write a JS function that {x}?",
                "In JavaScript, how do I write a function that {x}?",
                "Write a short JavaScript function that {x}. Use modern syntax.",
                "I need a JavaScript helper that {x}.", "Show me a JavaScript function that {x}, with an example.")
JS_TASKS = ("capitalizes the first letter of a string", "returns the largest number in an array",
            "removes duplicate values from an array", "counts the words in a string",
            "checks whether an object is empty", "formats a number as a price with two decimals",
            "debounces another function", "shuffles an array",
            "turns an array of objects into a lookup object keyed by id",
            "returns the number of days until a given date", "sums all the numbers in an array",
            "checks whether a string is a valid hex color code")
SQL_TEMPLATES = ("Given {table}, write a SQL query that {x}.", "I have {table}. How do I write a query that {x}?",
                 "Write a SQL query that {x}. My database has {table}.",
                 "Can you help me with SQL? I have {table}, and I need a query that {x}.",
                 "SQL question: with {table}, write a query that {x}.",
                 "Using {table}, write a query that {x}, and explain it briefly.")
EMPLOYEES = "a table employees(id, name, department, salary, hire_date)"
PRODUCTS_T = "a table products(id, name, category, price, stock)"
SHOP = "two tables, customers(id, name, city) and orders(id, customer_id, total, order_date)"
SQL_TASKS = ((EMPLOYEES, "lists the three highest-paid employees"),
             (EMPLOYEES, "shows the average salary in each department"),
             (EMPLOYEES, "finds employees hired in the last year"),
             (EMPLOYEES, "counts the employees in each department"),
             (PRODUCTS_T, "finds products that are out of stock"),
             (PRODUCTS_T, "finds the cheapest product in each category"),
             (PRODUCTS_T, "raises the price of every book by 10 percent"),
             (SHOP, "shows each customer's total spending"), (SHOP, "finds customers who have never placed an order"),
             (SHOP, "counts customers in each city, largest first"),
             (SHOP, "finds the month with the highest total sales"),
             (EMPLOYEES, "finds names that appear more than once"))
BASH_TEMPLATES = ("Write a bash command that {x}.", "How do I write a shell one-liner that {x}?",
                  "Give me a bash script that {x}.", "On Linux, which command {x}?",
                  "Can you show me a bash one-liner that {x}?", "Write a small shell script that {x}, with comments.")
BASH_TASKS = ("counts the lines in every .txt file in a folder",
              "finds all files larger than 100 MB in my home directory", "renames every .jpeg file in a folder to .jpg",
              "shows the 10 largest files in the current directory", "deletes log files older than 30 days",
              "shows which process is using port 8080", "counts how many times the word error appears in a log file",
              "backs up a folder into a dated .tar.gz archive", "prints the disk usage of each subfolder",
              "replaces a word in every .txt file in a folder", "lists only the directories in the current folder",
              "checks the SHA-256 checksum of a downloaded file")

SNIPPET_TEMPLATES = ("What does this {lang} code do?\n\n```{tag}\n{code}\n```",
                     "Can you explain this code line by line?\n\n```{tag}\n{code}\n```",
                     "I found this snippet online. What is it doing?\n\n```{tag}\n{code}\n```",
                     "Explain this {lang} snippet to a beginner:\n\n```{tag}\n{code}\n```",
                     "```{tag}\n{code}\n```\n\nWhat does this do, and when would I use it?",
                     "Walk me through what happens when this {lang} code runs:\n\n```{tag}\n{code}\n```")
SNIPPETS = (
    ("python", "def count_vowels(text):\n    return sum(1 for ch in text.lower() if ch in \"aeiou\")"),
    ("python", "numbers = [3, 8, 1, 9, 4]\nevens = [n for n in numbers if n % 2 == 0]\nprint(evens)"),
    ("python", "from collections import Counter\n\nwords = \"the cat and the hat\".split()\n"
               "print(Counter(words).most_common(1))"),
    ("python", "def greet(name=\"friend\"):\n    return f\"Hello, {name}!\"\n\nprint(greet())\nprint(greet(\"Ana\"))"),
    ("python", "with open(\"notes.txt\", \"a\") as f:\n    f.write(\"New line\\n\")"),
    ("python", "squares = {n: n * n for n in range(1, 6)}\nprint(squares[4])"),
    ("python", "def is_even(n):\n    return n % 2 == 0\n\nprint(list(filter(is_even, range(10))))"),
    ("python", "total = 0\nfor i in range(1, 101):\n    total += i\nprint(total)"),
    ("javascript", "const prices = [4, 10, 7];\nconst total = prices.reduce((sum, p) => sum + p, 0);\n"
                   "console.log(total);"),
    ("javascript", "document.querySelector(\"button\").addEventListener(\"click\", () => {\n"
                   "  alert(\"Clicked!\");\n});"),
    ("javascript", "const names = [\"Zoe\", \"adam\", \"Mia\"];\nnames.sort((a, b) => a.localeCompare(b));\n"
                   "console.log(names);"),
    ("sql", "SELECT department, AVG(salary) AS avg_salary\nFROM employees\nGROUP BY department\n"
            "HAVING AVG(salary) > 50000;"),
    ("sql", "SELECT c.name, COUNT(o.id) AS orders\nFROM customers c\nLEFT JOIN orders o ON o.customer_id = c.id\n"
            "GROUP BY c.name;"),
    ("bash", "for f in *.jpg; do\n  mv \"$f\" \"backup_$f\"\ndone"),
    ("bash", "grep -r \"TODO\" src/ | wc -l"),
    ("python", "class Counter:\n    def __init__(self):\n        self.count = 0\n\n    def increment(self):\n"
               "        self.count += 1\n        return self.count"),
    ("python", "try:\n    age = int(input(\"Age: \"))\nexcept ValueError:\n    print(\"Please enter a number.\")"),
)
BUG_TEMPLATES = ("This code has a bug. {symptom} Can you fix it?\n\n```{tag}\n{code}\n```",
                 "Why doesn't this work? {symptom}\n\n```{tag}\n{code}\n```",
                 "Can you find the mistake in my {lang} code? {symptom}\n\n```{tag}\n{code}\n```",
                 "```{tag}\n{code}\n```\n\n{symptom} What am I doing wrong?",
                 "Help me debug this {lang} snippet. {symptom}\n\n```{tag}\n{code}\n```",
                 "Please fix this code and briefly explain the problem. {symptom}\n\n```{tag}\n{code}\n```")
BUGS = (
    ("python", "def average(nums):\n    total = 0\n    for n in nums:\n        total += n\n"
               "    return total / len(nums)\n\nprint(average([]))", "It crashes with a ZeroDivisionError."),
    ("python", "def add_item(item, items=[]):\n    items.append(item)\n    return items\n\nprint(add_item(\"a\"))\n"
               "print(add_item(\"b\"))", "The second call prints ['a', 'b'] instead of ['b']."),
    ("python", "for i in range(1, 10):\n    if i % 2 = 0:\n        print(i)", "I get a SyntaxError."),
    ("python", "age = input(\"Age: \")\nprint(\"Next year you will be \" + age + 1)", "It raises a TypeError."),
    ("python", "def factorial(n):\n    return n * factorial(n - 1)", "It never stops and ends with a RecursionError."),
    ("python", "scores = {\"ana\": 90, \"ben\": 75}\nprint(scores[\"Ana\"])", "I get a KeyError."),
    ("python", "items = [2, 4, 6, 1]\nfor item in items:\n    if item % 2 == 0:\n        items.remove(item)\n"
               "print(items)", "I expected [1], but it prints [4, 1]."),
    ("javascript", "const nums = [10, 1, 5];\nnums.sort();\nconsole.log(nums);",
     "It prints [1, 10, 5] instead of [1, 5, 10]."),
    ("javascript", "function isAdult(age) {\n  if (age = 18) {\n    return true;\n  }\n  return age > 18;\n}",
     "It returns true for every age."),
    ("javascript", "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}",
     "It prints 3 three times instead of 0, 1, 2."),
    ("sql", "SELECT name, COUNT(*)\nFROM orders\nWHERE COUNT(*) > 5\nGROUP BY name;",
     "The database says aggregate functions are not allowed in WHERE."),
    ("bash", "#!/bin/bash\nname = \"world\"\necho \"Hello, $name\"", "It says 'name: command not found'."),
    ("python", "def last_item(lst):\n    return lst[len(lst)]", "I get an IndexError."),
    ("python", "total = 0\nfor price in [\"4.50\", \"3.25\"]:\n    total += price\nprint(total)",
     "It raises TypeError: unsupported operand type(s)."),
)

CHAT_LINES = ("hi, how are you?", "Tell me a joke.", "Good morning!", "I'm bored. Can you entertain me?",
              "Tell me a fun fact.", "What should I have for dinner tonight?", "Do you like music?",
              "I just got a new puppy!", "Tell me something that will make me smile.", "hey there",
              "What can you help me with?", "Tell me a riddle.", "I had a rough day at work.", "What's your name?",
              "Can you recommend a good movie for a rainy evening?", "I finally finished my thesis today!",
              "Say something nice.", "What's a good question to start a conversation with a stranger?",
              "I can't decide between pizza and sushi tonight. Help!",
              "Give me a random word and I'll make a sentence with it.", "It's my birthday today.",
              "Do you ever get tired?", "What's your favorite season and why?", "Tell me a tongue twister.",
              "Can we play twenty questions?", "I'm nervous about my driving test tomorrow.", "Hello! Who are you?",
              "What's something interesting I could learn today?", "Thanks for your help earlier!",
              "Recommend a hobby I can start this weekend.", "Good night!",
              "I'm learning to juggle. Any encouragement?")
JOKE_TEMPLATES = ("Tell me a joke about {x}.", "Do you know any jokes about {x}?",
                  "Make me laugh with a joke about {x}.", "Hi! Can you tell me a short, clean joke about {x}?",
                  "I need a pun about {x}.", "Tell me a silly joke about {x} for my kids.")
JOKES = ("cats", "computers", "coffee", "math", "dinosaurs", "the ocean", "vegetables", "programmers", "penguins",
         "the weather", "teachers", "pizza", "space", "bicycles", "books", "cows", "trains", "chemistry", "music",
         "socks")

WORD_WRAPS = ("{x}", "Solve this: {x}", "{x} Show your work.", "Can you help with this math problem? {x}",
              "{x} Explain step by step.", "Word problem: {x}", "My daughter is stuck on this homework question: {x}")

# Multi-turn chats: (tag, question, short answer, follow-up, short answer). Tag i = informational, c = code, x = other.
CHATS = (
    ("i", "What is the capital of Canada?", "The capital of Canada is Ottawa, in the province of Ontario.",
     "What languages do people speak there?", "Ottawa is officially bilingual, so you hear both English and French, "
     "though English is more common day to day."),
    ("i", "How many days are in a leap year?", "A leap year has 366 days instead of 365. The extra day is February 29.",
     "Why do we need leap years?", "Earth takes about 365.25 days to orbit the Sun. Adding a day every four years "
     "keeps the calendar in step with the seasons."),
    ("i", "Can you recommend a good houseplant for beginners?", "A pothos is a great choice. It tolerates low light, "
     "forgives missed waterings, and grows quickly.", "How often should I water it?", "Water it when the top few "
     "centimeters of soil feel dry, usually about once a week. In winter it needs less."),
    ("c", "Write a Python function that returns the largest number in a list.",
     "```python\ndef largest(numbers):\n    return max(numbers)\n```", "Can you do it without using max?",
     "```python\ndef largest(numbers):\n    best = numbers[0]\n    for n in numbers[1:]:\n        if n > best:\n"
     "            best = n\n    return best\n```"),
    ("x", "What's a good name for a grey cat?", "How about Smokey, Ash, Pebble, or Earl Grey?",
     "I like Pebble. Can you suggest a middle name to go with it?", "Pebble Moonbeam has a nice ring to it. "
     "Pebble Whiskers or Pebble Jade would also work."),
    ("i", "How do I convert Celsius to Fahrenheit?", "Multiply the Celsius temperature by 9/5 and add 32. For example, "
     "20 °C is 68 °F.", "What is 35 degrees Celsius in Fahrenheit?",
     "35 × 9/5 = 63, and 63 + 32 = 95, so 35 °C is 95 °F."),
    ("i", "I want to start reading more. Any tips?", "Keep a book with you, set a small daily goal like ten pages, and "
     "pick books you enjoy rather than ones you feel you should read.",
     "Which genre would suit someone who likes puzzles?", "Mystery novels are a natural fit. Detective stories let you "
     "gather clues and try to solve the case before the end."),
    ("i", "What's the difference between a hill and a mountain?", "There is no strict rule, but mountains are usually "
     "taller and steeper than hills.", "What is the tallest mountain in Europe?", "Mount Elbrus in Russia, at about "
     "5,642 meters, is usually counted as the tallest mountain in Europe."),
    ("i", "Can you help me plan a simple weekly workout?", "Sure. Try three days of 30-minute brisk walks, two days of "
     "bodyweight exercises like squats and push-ups, and two rest days.", "I only have 20 minutes a day. How should I "
     "change it?", "Keep the same pattern but shorten each session: 20-minute walks, and a quick circuit of squats, "
     "push-ups, and planks on strength days."),
    ("c", "How do I reverse a string in JavaScript?", "Split it into characters, reverse the array, and join it "
     "back:\n\n"
     "```javascript\nconst reversed = str.split(\"\").reverse().join(\"\");\n```", "Does that work with emoji?",
     "Not always, because some emoji are made of two code units. `Array.from(str).reverse().join(\"\")` handles most "
     "of them better."),
    ("x", "Do you know any good jokes?", "Why don't scientists trust atoms? Because they make up everything!",
     "Haha, tell me another one.", "What do you call a fake noodle? An impasta!"),
    ("i", "What should I cook tonight? I have rice, eggs, and some frozen peas.", "You could make egg fried rice. "
     "Scramble the eggs in a hot pan, then stir in cooked rice and the peas with a little soy sauce.",
     "I don't have soy sauce. What can I use instead?", "A pinch of salt with a splash of stock works fine. Garlic "
     "and black pepper add extra flavor."),
    ("i", "How long should I let a cake cool before frosting it?", "Let it cool completely, usually one to two hours. "
     "Frosting a warm cake makes the frosting melt and slide.", "Can I speed that up?", "Yes. Once it is out of the "
     "pan, put it in the fridge for 20 to 30 minutes."),
    ("i", "What is a prime number?", "A prime number is a whole number greater than 1 that can only be divided evenly "
     "by 1 and itself, like 2, 3, 5, 7, and 11.", "Is 51 a prime number?", "No. 51 is 3 times 17, so it has divisors "
     "other than 1 and itself."),
    ("i", "I'm going to Spain next week. Which phrases should I learn?", "Start with hola (hello), gracias "
     "(thank you), por favor (please), and ¿cuánto cuesta? (how much is it?).", "How do I say 'I would like a coffee'?",
     "You can say \"Quisiera un café, por favor.\" \"Me gustaría un café\" also works."),
    ("c", "Can you write a SQL query to count the rows in a table called orders?",
     "```sql\nSELECT COUNT(*) FROM orders;\n```",
     "Now count only the orders from 2024.", "Assuming the table has an order_date column:\n\n```sql\nSELECT COUNT(*) "
     "FROM orders\nWHERE order_date >= '2024-01-01' AND order_date < '2025-01-01';\n```"),
    ("i", "Why do we have seasons?", "Earth's axis is tilted about 23.5 degrees. As Earth orbits the Sun, each "
     "hemisphere takes turns leaning toward it, which brings longer days and more direct sunlight in summer.",
     "So is it summer in Australia when it's winter in Canada?", "Exactly. The Southern Hemisphere has summer while "
     "the Northern Hemisphere has winter, so Christmas in Australia falls in summer."),
    ("i", "What's a good way to remember people's names?", "Repeat the name when you are introduced, use it once in "
     "conversation, and link it to something memorable about the person.", "What if I forget it anyway?",
     "Be honest and friendly: \"Sorry, could you remind me of your name?\" Most people understand."),
    ("c", "How do I list all files in a folder, including hidden ones, in bash?", "Use `ls -a`. For sizes and dates "
     "as well, use `ls -la`.", "How do I sort them by size?", "Add the -S flag: `ls -laS` lists the largest files "
     "first. Add -h to show sizes like 4.0K or 2.1M."),
    ("x", "Can you suggest a name for my new coffee shop?", "Here are a few ideas: The Daily Grind, Bean There, "
     "Morning Ritual, and Common Cup.", "It's by the sea. Any names that fit that?",
     "Try Harbor Brew, Salt & Steam, The Tide Cup, or Driftwood Coffee."),
    ("i", "What's the best way to learn to play guitar?", "Start with a few basic chords like G, C, D, and E minor, "
     "practice 15 minutes every day, and learn simple songs you love.", "My fingertips hurt. Is that normal?",
     "Yes, completely normal at first. Calluses form within a few weeks and the soreness fades."),
    ("x", "Write a haiku about rain.", "Soft rain on the roof\nthe garden drinks quietly\npuddles hold the sky",
     "Now write one about snow.",
     "Silent flakes drifting\nthe whole street holds its breath now\nfootprints lead nowhere"),
    ("c", "How do I make my Python script read a file line by line?", "```python\nwith open(\"data.txt\") as f:\n"
     "    for line in f:\n        print(line.strip())\n```", "How do I skip empty lines?", "Check the stripped line "
     "first:\n\n```python\nwith open(\"data.txt\") as f:\n    for line in f:\n        line = line.strip()\n"
     "        if line:\n            print(line)\n```"),
    ("x", "Hi! How are you today?", "I'm doing well, thanks for asking! How about you?", "Pretty good. I just finished "
     "a long week at work.", "Congratulations on making it through! I hope you get a relaxing weekend."),
    ("i", "How much should I tip at a restaurant in the United States?", "Around 15 to 20 percent of the bill before "
     "tax is standard for table service.", "What about takeout?", "Tipping for takeout is optional. Some people leave "
     "about 10 percent or round up, especially for large orders."),
    ("i", "Is it better to study in the morning or at night?", "It depends on you. Many people focus best in the "
     "morning, but night owls often do better later. Consistency matters most.", "I get sleepy at night. What should "
     "I do?", "Study earlier in the day, take short breaks, and keep the room bright. Stop at least an hour before "
     "bed."),
    ("i", "What is the Pythagorean theorem?", "In a right triangle, the square of the longest side equals the sum of "
     "the squares of the other two sides: a² + b² = c².", "If the two short sides are 6 and 8, how long is the "
     "longest side?", "6² + 8² = 36 + 64 = 100, and the square root of 100 is 10, so the longest side is 10."),
    ("i", "Can you give me a packing list for a weekend camping trip?", "Tent, sleeping bag, sleeping pad, headlamp, "
     "water bottle, simple food, a small stove, warm layers, a rain jacket, a first aid kit, and sunscreen.",
     "What food is easy to bring?", "Oatmeal packets, trail mix, wraps, peanut butter, instant noodles, and apples "
     "are light and keep well without a fridge."),
    ("c", "How do I center a div in CSS?", "Use flexbox on the parent:\n\n```css\n.parent {\n  display: flex;\n"
     "  justify-content: center;\n  align-items: center;\n}\n```", "What if I only want to center it horizontally?",
     "Give the div a width and set `margin: 0 auto;`, or keep flexbox and use only `justify-content: center;`."),
    ("i", "Why do cats knock things off tables?", "Cats are curious and like to test how objects move. It is also a "
     "way to get attention and practice hunting skills.", "How can I get my cat to stop?", "Give it more play time, "
     "keep fragile things out of reach, and offer toys it can bat around."),
    ("i", "What is a good first programming language?", "Python is a popular first choice because its syntax is "
     "readable and it is used for everything from websites to data analysis.", "How long does it take to learn the "
     "basics?", "With about an hour of practice a day, most people are comfortable with variables, loops, and "
     "functions within a few weeks."),
    ("x", "Can you help me write a birthday message for my sister?", "Happy birthday to the best sister anyone could "
     "ask for! Thank you for the laughs, the advice, and the borrowed clothes.", "Can you make it funnier?",
     "Happy birthday, sis! Another year older, and you still haven't returned my favorite sweater. I'll let it slide "
     "today."),
    ("i", "How many bones are in the human body?", "An adult has 206 bones. Babies are born with around 270, and "
     "some fuse together as they grow.", "Which one is the smallest?", "The stapes, a tiny bone in the middle ear. "
     "It is only about 3 millimeters long."),
    ("i", "I need to save $1,000 in six months. How should I start?", "That is about $167 a month, or roughly $40 a "
     "week. Open a separate savings account and set up an automatic transfer on payday.", "Which expenses are usually "
     "easiest to cut?", "Subscriptions you rarely use, takeout meals, and impulse online purchases."),
    ("i", "What does HTML stand for?", "HTML stands for HyperText Markup Language. It describes the structure of web "
     "pages, such as headings, paragraphs, links, and images.", "And what is CSS for?", "CSS, or Cascading Style "
     "Sheets, controls how the HTML looks: colors, fonts, spacing, and layout."),
    ("c", "Can you explain what a for loop does in Python?", "A for loop repeats a block of code once for each item "
     "in a sequence:\n\n```python\nfor fruit in [\"apple\", \"pear\"]:\n    print(fruit)\n```",
     "How do I loop over the numbers from 1 to 10?",
     "Use range, which stops before its end value:\n\n```python\nfor i in range(1, 11):\n    print(i)\n```"),
    ("i", "What is the tallest animal in the world?",
     "The giraffe. Adult males can reach about 5.5 meters, or 18 feet.",
     "Why do they have such long necks?", "Long necks let giraffes reach leaves high in trees that other animals "
     "cannot get to. Males also use their necks when they compete."),
    ("x", "Tell me a fun fact about food.", "Honey never spoils. Archaeologists have found pots of honey in ancient "
     "Egyptian tombs that were still edible.", "Wow. Tell me another one.", "Bananas are berries, botanically "
     "speaking, but strawberries are not."),
    ("i", "How do I ask my boss for a raise?", "Book a private meeting, list your recent achievements with concrete "
     "results, research typical pay for your role, and name a specific number.", "What if they say no?",
     "Stay calm, ask what you would need to achieve to earn a raise, and agree on a time to revisit it."),
    ("i", "What time zone is London in?", "London uses Greenwich Mean Time (GMT) in winter and British Summer Time "
     "(BST), which is GMT+1, in summer.", "When do the clocks change?", "They go forward one hour on the last Sunday "
     "in March and back one hour on the last Sunday in October."),
    ("x", "Write a short poem about the ocean.", "The ocean hums a steady tune,\nit rises to the silver moon,\nit "
     "keeps the secrets of the deep\nand rocks the sleepy shore to sleep.", "Can you make it about a storm at sea "
     "instead?", "The sky turns black, the waters roar,\nthe waves crash hard against the shore,\nthe wind howls "
     "loud through mast and sail,\nuntil the dawn outlasts the gale."),
    ("c", "How do I check which version of Python I have?", "Open a terminal and run `python --version`. On some "
     "systems it is `python3 --version`.", "How do I check it from inside a script?",
     "```python\nimport sys\nprint(sys.version)\n```"),
)
FOLLOW_UPS = {
    "i": ("Can you explain that more simply?", "Can you give me an example?", "Why is that?",
          "Interesting. Can you tell me a bit more?", "Could you put that in a short bulleted list?",
          "Can you summarize that in one sentence?", "What's a common misconception about this?",
          "How would I explain that to a child?", "Are there any exceptions?"),
    "c": ("Can you add comments to the code?", "Can you add type hints?", "How would I test this?",
          "What happens if the input is empty?", "Can you explain how it works step by step?",
          "Is there a shorter way to write it?", "What's the time complexity?"),
    "x": (),
}
BRIDGES = {   # a thank-you turn that lets a chat move on to a new request
    "i": (("Thanks, that's helpful!", "You're welcome! Is there anything else I can help with?"),
          ("Great, thank you.", "Happy to help. Let me know if you have more questions."),
          ("Perfect, thanks!", "Glad it helped! What else would you like to know?"),
          ("Got it, thanks. I have another question.", "Sure, go ahead.")),
    "x": (("Thanks! Can I ask you something else?", "Of course. What would you like to know?"),
          ("Ha, I like that. Different topic now.", "Sure, go ahead!")),
}
BRIDGES["c"] = BRIDGES["i"]
SYSTEMS = ("You are a helpful assistant.", "You are a helpful assistant. Answer clearly and briefly.",
           "You are a friendly assistant. Keep your answers short and warm.",
           "You are a patient teacher who explains things step by step.",
           "You are a concise assistant. Use plain language and avoid jargon.",
           "You are a cheerful assistant who likes to add a little humor.",
           "You are a knowledgeable assistant. If you are not sure about something, say so.",
           "You are an assistant for busy people. Answer in three sentences or fewer.",
           "You are a careful writing assistant. Use correct grammar and a polite tone.",
           "You are a calm, supportive assistant.",
           "You are a helpful assistant that gives practical, specific answers.",
           "You are SmolLM, a small AI assistant. Be honest and helpful.")


# --------------------------------------------------------------------------------------------------------------
# Builders: each kind returns every candidate user prompt for one split ("train" or "held").
# --------------------------------------------------------------------------------------------------------------

def _split(items, split: str) -> list:
    """Every HOLD_EVERY-th value is reserved for held-out, so held-out prompts are about unseen things."""
    keep_held = split == "held"
    return [x for i, x in enumerate(items) if (i % HOLD_EVERY == HOLD_EVERY // 2) == keep_held]


def _phrasings(templates, split: str) -> list:
    """Train never sees the last phrasing of a kind; held-out may use any of them."""
    return list(templates[:-1]) if split == "train" else list(templates)


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _fill(templates, values, split: str, rng: random.Random) -> list[tuple[str, str]]:
    """Every (phrasing, value) pair as (value, prompt); {n} and {name} get a fresh number or name per prompt."""
    names = _split(NAMES, split)
    return [(v, t.format(x=v, n=rng.choice((3, 4, 5, 5, 6, 7, 10)), name=rng.choice(names)))
            for t in _phrasings(templates, split) for v in _split(values, split)]


def _factual(split, rng):
    return _fill(FACT_WRAPS, FACTS, split, rng) + _fill(ABOUT_TEMPLATES, ABOUT, split, rng)


def _compare(split, rng):
    return [(a + b, t.format(a=a, b=b)) for t in _phrasings(COMPARE_TEMPLATES, split)
            for a, b in _split(COMPARE, split)]


def _poems(split, rng):
    return [(x, t.format(form=rng.choice(POEM_FORMS), x=x)) for t in _phrasings(POEM_TEMPLATES, split)
            for x in _split(POEMS, split)]


def _translate(split, rng):
    return [(s, t.format(x=s, lang=lang)) for t in _phrasings(TRANSLATE_TEMPLATES, split)
            for s in _split(SENTENCES, split) for lang in LANGUAGES]


def _sql(split, rng):
    return [(task, t.format(table=table, x=task)) for t in _phrasings(SQL_TEMPLATES, split)
            for table, task in _split(SQL_TASKS, split)]


def _code(templates, items, split):
    """Snippet prompts: the code sits in a fenced block tagged with its language."""
    return [(item[1], t.format(lang=LANG_NAMES[item[0]], tag=item[0], code=item[1], symptom=item[-1]))
            for t in _phrasings(templates, split) for item in _split(items, split)]


def _chat(split, rng):
    lines = [(x, _cap(x) if rng.random() < 0.5 else x) for x in _split(CHAT_LINES, split)]   # people type both ways
    return lines + _fill(JOKE_TEMPLATES, JOKES, split, rng)


def _word_problems(split, rng):
    """Arithmetic word problems with fresh numbers (keyed by shape); the last two shapes are held-out only."""
    def name():
        return rng.choice(_split(NAMES, split))
    r = rng.randint
    shapes = [
        lambda: f"{(a := name())} has {r(5, 30)} apples and buys {r(2, 20)} more. Then {a} gives {r(1, 5)} to a "
                f"friend. How many apples does {a} have now?",
        lambda: f"A train travels at {r(6, 24) * 5} km per hour for {r(2, 6)} hours. How far does it go?",
        lambda: f"A recipe for {r(2, 4)} people needs {r(2, 8) * 50} grams of flour. How much flour do I need for "
                f"{r(5, 12)} people?",
        lambda: f"A jacket costs ${r(4, 30) * 5}. It is on sale for {rng.choice((10, 15, 20, 25, 30, 40))}% off. "
                f"What is the sale price?",
        lambda: f"Dinner for {r(3, 8)} friends costs ${r(60, 240)}, plus a {rng.choice((10, 15, 18, 20))}% tip. "
                f"If they split it evenly, how much does each person pay?",
        lambda: f"{(a := name())} works {r(10, 40)} hours a week and earns ${r(12, 30)} per hour. How much does "
                f"{a} earn in {r(2, 8)} weeks?",
        lambda: f"{name()} saves ${(s := r(5, 50))} every week. How many weeks will it take to save ${s * r(6, 30)}?",
        lambda: f"A room is {r(3, 9)} meters long and {r(2, 7)} meters wide. How many square meters of carpet are "
                f"needed to cover the floor?",
        lambda: f"{name()} scored {r(55, 100)}, {r(55, 100)}, and {r(55, 100)} on three tests. "
                f"What is the average score?",
        lambda: f"A book has {(p := r(150, 500))} pages. {name()} reads {(q := r(10, 40))} pages a day. "
                f"How many pages are left after {r(2, (p - 1) // q)} days?",
        lambda: f"A bus leaves at {r(6, 20)}:{rng.choice(('05', '15', '20', '30', '45', '50'))} and the trip takes "
                f"{r(25, 150)} minutes. What time does it arrive?",
        lambda: f"{(a := name())} buys {r(2, 9)} notebooks at ${r(2, 6)} each and pays with a $50 bill. How much "
                f"change does {a} get?",
        lambda: f"A tank holds {r(4, 20) * 30} liters of water and leaks {rng.choice((5, 6, 10, 15))} liters per "
                f"hour. How many hours until it is empty?",
        lambda: f"{(ab := rng.sample(_split(NAMES, split), 2))[0]} is {r(6, 40)} years old. {ab[1]} is {r(2, 15)} "
                f"years older than {ab[0]}. How old will {ab[1]} be in {r(2, 10)} years?",
    ]
    shapes = shapes[:-2] if split == "train" else shapes[-2:]
    wraps = _phrasings(WORD_WRAPS, split)
    return [(i % len(shapes), rng.choice(wraps).format(x=shapes[i % len(shapes)]())) for i in range(40 * len(shapes))]


# kind -> (weight among single-turn prompts, builder returning (value, prompt) pairs)
KINDS = {
    "factual": (14, _factual),
    "explain": (7, lambda s, rng: _fill(EXPLAIN_TEMPLATES, EXPLAIN, s, rng)),
    "howto": (7, lambda s, rng: _fill(HOWTO_TEMPLATES, HOWTO, s, rng)),
    "compare": (5, _compare),
    "lists": (7, lambda s, rng: _fill(IDEA_TEMPLATES, IDEAS, s, rng) + _fill(LIST_TEMPLATES, LISTS, s, rng)),
    "email": (4, lambda s, rng: _fill(EMAIL_TEMPLATES, EMAILS, s, rng)),
    "thanks": (2, lambda s, rng: _fill(THANKS_TEMPLATES, THANKS, s, rng)),
    "product": (2, lambda s, rng: _fill(PRODUCT_TEMPLATES, PRODUCTS, s, rng)),
    "poem": (3, _poems),
    "story": (3, lambda s, rng: _fill(STORY_TEMPLATES, STORIES, s, rng)),
    "rewrite": (4, lambda s, rng: _fill(REWRITE_TEMPLATES, PASSAGES, s, rng)),
    "grammar": (3, lambda s, rng: _fill(GRAMMAR_TEMPLATES, GRAMMAR, s, rng)),
    "translate": (5, _translate),
    "math": (5, _word_problems),
    "define": (4, lambda s, rng: _fill(DEFINE_TEMPLATES, DEFINE, s, rng)),
    "advice": (6, lambda s, rng: _fill(ADVICE_TEMPLATES, ADVICE, s, rng) + _fill(TIPS_TEMPLATES, TIPS, s, rng)),
    "code_py": (7, lambda s, rng: _fill(PY_TEMPLATES, PY_TASKS, s, rng)),
    "code_js": (1.5, lambda s, rng: _fill(JS_TEMPLATES, JS_TASKS, s, rng)),
    "code_sql": (1.2, _sql),
    "code_bash": (1.2, lambda s, rng: _fill(BASH_TEMPLATES, BASH_TASKS, s, rng)),
    "code_explain": (2.3, lambda s, rng: _code(SNIPPET_TEMPLATES, SNIPPETS, s)),
    "code_fix": (2, lambda s, rng: _code(BUG_TEMPLATES, BUGS, s)),
    "chat": (4, _chat),
}
FIRST_HELD = ("factual", "explain", "code_py", "email", "multi")   # held_out_prompts(5): one of each, in this order


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _multi_turn(split: str, rng: random.Random, singles: list[str]) -> list[tuple[str, list[dict]]]:
    """Chats whose earlier assistant turns are the short answers written above; some go on for a third user turn."""
    out = []
    for tag, q, a, f, fa in _split(CHATS, split):
        base = [_user(q), _assistant(a)]
        out.append((q, base + [_user(f)]))
        out += [(q, base + [_user(g)]) for g in FOLLOW_UPS[tag]]
        out += [(q, base + [_user(f), _assistant(fa), _user(g)]) for g in FOLLOW_UPS[tag]]
        for thanks, reply in BRIDGES[tag]:
            bridge = [_user(thanks), _assistant(reply)]
            if tag != "x":   # small talk moves on only after its follow-up
                out.append((q, base + bridge + [_user(rng.choice(singles))]))
            out.append((q, base + [_user(f), _assistant(fa)] + bridge + [_user(rng.choice(singles))]))
    return out


def _spread(pairs: list[tuple], rng: random.Random) -> list:
    """Shuffle, then order round-robin by value, so no topic repeats before every topic of the kind has appeared."""
    rng.shuffle(pairs)
    uses: dict = {}
    ranked = []
    for i, (value, item) in enumerate(pairs):
        uses[value] = uses.get(value, 0) + 1
        ranked.append((uses[value], i, item))
    return [item for _, _, item in sorted(ranked, key=lambda r: r[:2])]


def _allocate(weights: dict[str, float], total: int) -> dict[str, int]:
    """Split `total` in proportion to `weights` (largest remainder, ties broken by kind order)."""
    s = sum(weights.values())
    exact = {k: total * w / s for k, w in weights.items()}
    counts = {k: int(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: -(exact[k] - counts[k]))[:total - sum(counts.values())]:
        counts[k] += 1
    return counts


def _key(conv: list[dict]) -> str:
    return "\n\n".join(m["content"] for m in conv)


def _build(split: str, seed: int, size: int) -> list[list[dict]]:
    """Draw `size` distinct conversations for one split: singles by kind weight, ~15% multi-turn, ~5% system."""
    pools = {}
    for kind, (_, builder) in KINDS.items():
        rng = random.Random(f"{seed}:{split}:{kind}")
        pools[kind] = _spread(builder(split, rng), rng)
    rng = random.Random(f"{seed}:{split}:mix")
    multi = _spread(_multi_turn(split, rng, [p for kind in KINDS for p in pools[kind]]), rng)
    direct = {chat[3] for chat in CHATS}   # held_out_prompts shows a plain question-and-follow-up chat first
    plain = next(i for i, c in enumerate(multi) if len(c) == 3 and c[2]["content"] in direct)
    pools["multi"] = [multi.pop(plain)] + multi

    seen, picked = set(), []

    def take(kind: str, count: int) -> list[list[dict]]:
        got = []
        while pools[kind] and len(got) < count:
            item = pools[kind].pop(0)
            conv = item if kind == "multi" else [_user(item)]
            if _key(conv) not in seen:
                seen.add(_key(conv))
                got.append(conv)
        return got

    n_multi = round(size * MULTI_TURN_SHARE)
    first = [c for kind in FIRST_HELD for c in take(kind, 1)] if split == "held" else []
    n_single = size - n_multi - sum(len(c) == 1 for c in first)
    for kind, count in _allocate({k: w for k, (w, _) in KINDS.items()}, n_single).items():
        picked += take(kind, count)
    picked += take("multi", n_multi - sum(len(c) > 1 for c in first))
    rng.shuffle(picked)
    systems = _split(SYSTEMS, split)
    rng.shuffle(systems)
    for j, i in enumerate(sorted(rng.sample(range(len(picked)), round(size * SYSTEM_SHARE)))):
        picked[i] = [{"role": "system", "content": systems[j % len(systems)]}] + picked[i]
    return first + picked


def conversations(seed: int = SEED) -> tuple[list[list[dict]], list[list[dict]]]:
    """(train, held_out): lists of chats, each a list of {"role", "content"} messages ending with a user turn."""
    train, held = _build("train", seed, TRAIN_SIZE), _build("held", seed, HELD_OUT_SIZE)
    assert not {_key(c) for c in train} & {_key(c) for c in held}, "train and held-out overlap"
    return train, held


def fresh_conversations(n: int, seed: int = SEED, draws: int = 1) -> list[list[dict]]:
    """Up to n training chats that conversations() does not hold: a larger draw from the same training pools,
    less the shipped set, for training a drafter further on answers it has not seen (never held-out ones).
    One draw of 8,000 holds about 3,000 new chats; each further draw (the next seed) adds about 1,100 others,
    mostly new pairings of turns and new fillings, and leaves the earlier draws' chats as they were."""
    seen = {_key(c) for c in _build("train", seed, TRAIN_SIZE)}
    fresh: list[list[dict]] = []
    for k in range(draws):
        for c in _build("train", seed + k, TRAIN_SIZE + n):
            if len(fresh) < n and _key(c) not in seen:
                seen.add(_key(c))
                fresh.append(c)
    return fresh


def held_out_prompts(n: int = 5) -> list[list[dict]]:
    """The first n held-out chats; the first five are a factual question, an explanation, a Python task, an email
    and a multi-turn chat, so a handful of prompts already covers the main kinds."""
    return conversations()[1][:n]


def to_jsonl(convs) -> str:
    """One JSON list of messages per line."""
    return "".join(json.dumps(c, ensure_ascii=False) + "\n" for c in convs)


def check(convs: list[list[dict]]) -> None:
    """Raise if a chat is malformed: roles alternate, system only first, last turn from the user, no duplicates."""
    keys = [_key(c) for c in convs]
    assert len(set(keys)) == len(keys), "duplicate conversations"
    for c in convs:
        roles = [m["role"] for m in c]
        body = roles[1:] if roles[0] == "system" else roles
        assert body and all(r == ("user" if i % 2 == 0 else "assistant") for i, r in enumerate(body)), roles
        assert body[-1] == "user" and all(isinstance(m["content"], str) and m["content"].strip() for m in c), c


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder for train.jsonl and held_out.jsonl")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    train, held = conversations(args.seed)
    for name, convs in (("train", train), ("held_out", held)):
        check(convs)
        multi = sum(sum(m["role"] == "user" for m in c) > 1 for c in convs)
        system = sum(c[0]["role"] == "system" for c in convs)
        chars = sum(len(_key(c)) for c in convs) / len(convs)
        print(f"{name}: {len(convs)} conversations, {multi} multi-turn, {system} with a system message, "
              f"{chars:.0f} characters on average")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "train.jsonl").write_text(to_jsonl(train), encoding="utf-8")
        (args.out / "held_out.jsonl").write_text(to_jsonl(held), encoding="utf-8")
        print(f"wrote {args.out / 'train.jsonl'} and {args.out / 'held_out.jsonl'}")


if __name__ == "__main__":
    main()
